"""Dataset files: labelling rules, folder/CSV/zip/URL registration, checks, images.

No SQL here: the `datasets` table is `db.datasets`."""

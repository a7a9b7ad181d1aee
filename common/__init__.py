"""Settings and helpers every room shares: the data folder, file helpers, CLI
parsing, the entry point wrapper, error messages. Imports no other room."""

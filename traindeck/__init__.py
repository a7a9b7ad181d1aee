"""The `traindeck` command."""

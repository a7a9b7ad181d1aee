"""traindeck's database room: the tables, the job queue, the dataset registry and the CLI.

Nothing here imports torch: the dashboard and the worker's supervisor both use this
package, and the supervisor must never load torch_xla (one process owns a TPU).
"""

"""traindeck's worker: a supervisor that claims jobs and a child process that trains each one.

The supervisor (`worker.supervisor`) never imports torch_xla: one process owns a TPU, and
that is the job's child (`worker.job_process`).
"""

"""Google Cloud: the Cloud TPU client (`cloud.tpu`), the TPU VM startup script
(`cloud.bootstrap`) and the preemption watcher (`python -m cloud.watch`). No Streamlit here:
the dashboard's TPU VMs page is a view over these modules."""

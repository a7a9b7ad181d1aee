"""Running a job's exported model: shared by `python -m worker predict` and the dashboard.

A room of its own, because `worker/` and `dashboard/` never import each other: it knows torch
and fastai, nothing of Streamlit, and reaches the database only through `db/`.
"""

"""traindeck's web dashboard (Streamlit). It reaches the database only through `db/`."""

"""Alerts sent through Apprise (Slack, Discord, Teams, e-mail, ntfy, a JSON webhook, …).

The tables, the events and the outbox are `db.alerts`; here are the two parts that need
Apprise: checking and masking a destination's URL (`destinations`), and sending the outbox's
alerts (`drain`), which every worker and every dashboard runs in a background thread.
"""

"""Snapshots of linpodx containers: commit + workspace archives, jobs, safe rollback.

`service` is the API the CLI calls; `worker` runs a create job detached from the CLI; the other
modules are the parts (names and paths, job files, freezing, workspace archives, fault points).
"""

"""Egress filtering: a per-container guard (network helper + policy DNS resolver + nftables).

`linpodx.egress.guard` is the API the container lifecycle calls: `prepare` before `podman
create` (it also launches the guard process, which waits for the pid), `attach` after
`podman init`, `status` for `linpodx ps`, `update_profile` after a re-apply, `detach` on
removal.
"""

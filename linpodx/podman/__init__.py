"""Everything that speaks to podman: a pure argv builder, the engine calls, the host probe.

`argv` never runs anything (unit-tested against fixed argv tuples); `engine` runs podman through
`linpodx.proc`, the one subprocess chokepoint; `probe` reads host facts the builder needs.
"""

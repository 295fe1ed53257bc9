"""`python -m linpodx.cli.docgen`: write the files made from the CLI's help text (the root's
stored help, linpodx/cli/roothelp.txt, and the man page, docs/man/linpodx.1). A program of its
own above `linpodx.cli.main`, so that the modules below it import one way
(tests/unit/test_cli_surface.py holds the files current)."""

from __future__ import annotations

from linpodx.cli import main, surface

if __name__ == "__main__":
    for written in surface.refresh(main.command_tree(None)):
        print(written)

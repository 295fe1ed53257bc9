"""`linpodx version --json` is one JSON document like every other command's."""

import json

from linpodx.cli.main import main


def test_version_json(capsys):
    assert main(["version", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and set(doc["result"]) == {"version", "python"}

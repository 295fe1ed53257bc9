"""`run -e`/`--env-file`/`--secret` (linpodx.containers.runenv): parsed as podman does, values
kept to the memory file podman reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from linpodx.containers.request import RunRequest
from linpodx.containers.runenv import RunEnv, env_fd, parse_secret, resolve
from linpodx.errors import InvalidInput, NotFound

VALUE = "sk-test-0123456789abcdef"
RESERVED = {"HOME": "linpodx", "LANG": "profile p"}


def test_values_from_e_env_file_and_this_environment(tmp_path: Path) -> None:
    f = tmp_path / "env"
    f.write_text("# a comment\n\n  FROM_FILE=a=b \nINHERITED\nSHARED=file\r\n")
    got = resolve(
        ["API_KEY=" + VALUE, "SHARED=e", "EMPTY="],
        [str(f)],
        [],
        reserved=RESERVED,
        environ={"INHERITED": "from-here"},
    )
    # Files first, then -e; the later value of a name replaces the earlier (podman's order).
    assert got.keys == ("FROM_FILE", "INHERITED", "API_KEY", "SHARED", "EMPTY")
    assert got.content == (
        f"FROM_FILE=a=b \nINHERITED=from-here\nAPI_KEY={VALUE}\nSHARED=e\nEMPTY=\n".encode()
    )


def test_values_are_in_no_repr() -> None:
    got = resolve(["API_KEY=" + VALUE], [], [], reserved=RESERVED, environ={})
    assert VALUE not in repr(got)
    assert VALUE not in repr(RunRequest(image="i", env=("API_KEY=" + VALUE,)))


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (["NOT_SET"], "NOT_SET is not set in this environment"),
        (["1BAD=" + VALUE], "invalid environment variable name"),
        (["A-B=" + VALUE], "invalid environment variable name"),
        (["LANG=" + VALUE], "LANG is set by profile p"),
        (["HOME=/tmp"], "HOME is set by linpodx"),
        ([f"K={VALUE}\nEVIL=1"], "newline"),
        ([f"K={VALUE}\r"], "newline"),
    ],
)
def test_refused_without_showing_the_value(env: list[str], words: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        resolve(env, [], [], reserved=RESERVED, environ={})
    assert words in exc.value.message
    assert VALUE not in exc.value.message and VALUE not in (exc.value.hint or "")


def test_env_file_problems(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        resolve([], [str(tmp_path / "none")], [], reserved={}, environ={})
    bad = tmp_path / "bad"
    bad.write_text(f"GOOD=1\nBAD KEY={VALUE}\n")
    with pytest.raises(InvalidInput, match="line 2") as exc:
        resolve([], [str(bad)], [], reserved={}, environ={})
    assert VALUE not in exc.value.message


@pytest.mark.parametrize(
    "body",
    [
        # A value on several lines (a PEM key pasted in): its next lines read as `KEY` alone
        # (a name to take from this environment) or as no name at all.
        "KEY=-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAo\n-----END-----\n",
        "KEY=-----BEGIN KEY-----\nMIIEvQIBADANBgkq+hkiG9w0BAQEFAASCBKcw/ggSjAgEAAo\n",
        "KEY=-----BEGIN KEY-----\nMIIEvQIBADANBgkq+hkiG9w0BAQEFAASCBKcw/ggSjAgEAAo==\n",
    ],
)
def test_env_file_refusal_shows_no_line_of_it(tmp_path: Path, body: str) -> None:
    f = tmp_path / "env"
    f.write_text(body)
    with pytest.raises(InvalidInput, match="line 2") as exc:
        resolve([], [str(f)], [], reserved={}, environ={})
    for shown in (exc.value.message, exc.value.hint or ""):
        assert "MIIEvQIBADANBgkq" not in shown


@pytest.mark.parametrize(
    ("arg", "podman"),
    [
        ("api-key", "api-key"),
        ("api-key,type=env,target=API_KEY", "api-key,type=env,target=API_KEY"),
        ("cert,target=/etc/cert.pem", "cert,target=/etc/cert.pem"),
        ("tok,target=tok.txt,type=mount", "tok,type=mount,target=tok.txt"),
    ],
)
def test_secrets_rebuilt_from_checked_parts(arg: str, podman: str) -> None:
    assert parse_secret(arg) == podman


@pytest.mark.parametrize(
    "arg",
    [
        "",
        "-x",
        "a b",
        "key,uid=0",  # only type and target reach podman
        "key,type=env,target=1X",
        "key,type=file",
        "key,target=../../etc/passwd",
        "key,target=",
        "key,type=env,type=mount",
    ],
)
def test_bad_secrets_are_refused(arg: str) -> None:
    with pytest.raises(InvalidInput):
        parse_secret(arg)


def test_secret_targets_do_not_collide() -> None:
    with pytest.raises(InvalidInput, match="twice"):
        resolve([], [], ["k", "k,target=x"], reserved={}, environ={})
    with pytest.raises(InvalidInput, match="set already"):
        resolve(["API_KEY=1"], [], ["k,type=env,target=API_KEY"], reserved={}, environ={})
    got = resolve([], [], ["k,type=env,target=API_KEY"], reserved={}, environ={})
    assert got.secrets == ("k,type=env,target=API_KEY",) and got.secret_names() == ("k",)
    assert got.content == b""


def test_memory_file_holds_the_lines_and_is_closed_after() -> None:
    run_env = RunEnv(keys=("API_KEY",), content=f"API_KEY={VALUE}\n".encode())
    with env_fd(run_env) as fd:
        assert fd is not None
        assert not os.get_inheritable(fd)  # only the podman it is lent to gets it
        # What podman opens: /dev/fd/N reopens the memory file from its start.
        with open(f"/dev/fd/{fd}", "rb") as f:
            assert f.read() == f"API_KEY={VALUE}\n".encode()
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
    with pytest.raises(OSError):
        os.fstat(fd)
    with env_fd(RunEnv()) as none:
        assert none is None

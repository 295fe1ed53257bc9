"""Profile loader: the good profile, and every hostile class of THREATS.md "Profiles".

Each refusal asserts the exact `FILE:LINE:COL: key.path:` prefix and a fragment of the message.
"Nothing stored" for the same files is asserted through the CLI in test_cli_sandbox.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from linpodx import paths
from linpodx.errors import NotFound, ProfileError
from linpodx.profile import loader
from linpodx.profile.loader import MAX_BYTES, load_file, load_text, profile_from_dict, schemapass
from linpodx.profile.model import Decision, McpSettings, Profile, Resources

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host's runtime dir or agent socket must not change what these tests see.
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture
def home(isolated_state: Path) -> Path:
    (isolated_state / "project").mkdir()
    return isolated_state


def write(tmp_path: Path, text: str, name: str = "p.yml") -> Path:
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    return f


def refused(path: Path) -> list[str]:
    with pytest.raises(ProfileError) as exc:
        load_file(path)
    assert exc.value.exit_code == 3
    assert exc.value.hint
    return list(exc.value.problems)


def assert_problem(problems: list[str], prefix: str, fragment: str) -> None:
    matching = [p for p in problems if p.startswith(prefix)]
    assert matching, f"no problem at {prefix!r} in {problems}"
    assert any(fragment in p for p in matching), f"{fragment!r} not in {matching}"


def mount_profile(source: str, target: str = "/workspace") -> str:
    # line 4 col 13 is where `source:`'s value starts; line 5 col 13 the target's.
    return f"name: p\nmounts:\n  - read_only: true\n    source: {source}\n    target: {target}\n"


# --- the good profile ---------------------------------------------------------------------


def test_example_profile_loads(home: Path) -> None:
    (home / "demo-project").mkdir()
    p = load_file(REPO / "examples" / "agent-readonly.yml")
    assert isinstance(p, Profile)
    assert p.name == "agent-readonly"
    assert p.mounts[0].source == os.path.realpath(home / "demo-project")
    assert p.mounts[0].target == "/workspace"
    assert p.mounts[0].read_only is True
    assert p.network.egress_dns_allowlist == ("registry.example.com", "crates.io")
    assert [(r.method, r.tool_name, r.decision) for r in p.mcp_policy] == [
        ("tools/call", "read_file", Decision.AUTO_ALLOW),
        ("tools/call", "write_file", Decision.PROMPT),
        ("tools/call", None, Decision.PROMPT),
    ]
    assert p.audit.hash_chain is True
    with pytest.raises(AttributeError):
        p.name = "x"  # type: ignore[misc]  # frozen


def test_defaults_and_normalization(home: Path, tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "name: n1\nmounts: [{source: '${HOME}/project', target: /w}]\n"
        "network: {egress_dns_allowlist: ['Crates.IO.', '*.Example.com'],"
        " upstream_dns: ['192.0.2.1', '192.0.2.2:5353', '[2001:db8:0::1]:53']}\n"
        "mcp_policy: [{method: '*', tool_name: '*', decision: deny}]\n"
        "resources: {cpus: 1.50, memory: 512M}\n"
        "cap_add: [chown, CAP_NET_BIND_SERVICE]\n"
        "env: {B: '2', A: '1'}\nworkdir: /w\n",
    )
    p = load_file(f)
    assert p.mounts[0].read_only is True  # read-only is the default
    assert p.network.egress_dns_allowlist == ("crates.io", "*.example.com")
    assert p.network.upstream_dns == ("192.0.2.1", "192.0.2.2:5353", "[2001:db8::1]:53")
    assert p.mcp_policy[0].tool_name is None
    assert p.resources == Resources(memory="512m", cpus="1.5")
    assert p.cap_add == ("CHOWN", "NET_BIND_SERVICE")
    assert p.env == (("A", "1"), ("B", "2"))
    assert p.workdir == "/w"
    assert p.mcp == McpSettings()
    assert p.version == 1


def test_empty_mcp_policy_is_allowed(tmp_path: Path) -> None:
    p = load_file(write(tmp_path, "name: quiet\n"))
    assert p.mcp_policy == ()
    assert p.mounts == ()
    assert p.network.egress_dns_allowlist == ()


def test_schema_defaults_match_the_model() -> None:
    s = loader.schema()
    props = s["properties"]
    model = Profile(name="x")
    assert props["description"]["default"] == model.description
    assert props["version"]["default"] == model.version
    assert props["mounts"]["items"]["properties"]["read_only"]["default"] is True
    for section, obj in (
        ("mcp", model.mcp),
        ("resources", model.resources),
        ("audit", model.audit),
        ("network", model.network),
    ):
        for key, node in props[section]["properties"].items():
            value = getattr(obj, key)
            expected = list(value) if isinstance(value, tuple) else value
            assert node["default"] == expected, f"{section}.{key}"
    assert s["$id"].endswith("profile-v1.json")


def test_every_schema_property_has_description_and_default() -> None:
    def walk(node: dict[str, object], path: str) -> None:
        for key, child in node.get("properties", {}).items():  # type: ignore[attr-defined]
            assert "description" in child, f"{path}{key}"
            assert "default" in child, f"{path}{key}"
            walk(child, f"{path}{key}.")
            items = child.get("items")
            if isinstance(items, dict):
                walk(items, f"{path}{key}[].")

    walk(loader.schema(), "")


def test_stored_form_round_trips(home: Path, tmp_path: Path) -> None:
    p = load_file(write(tmp_path, mount_profile("${HOME}/project")))
    assert profile_from_dict(p.to_dict()) == p


# --- mount sources --------------------------------------------------------------------------


def test_symlink_to_ssh_is_refused(home: Path, tmp_path: Path) -> None:
    (home / ".ssh").mkdir()
    (home / "innocent").symlink_to(home / ".ssh")
    probs = refused(write(tmp_path, mount_profile("${HOME}/innocent")))
    prefix = f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:"
    assert_problem(probs, prefix, "is the sensitive path")
    assert_problem(probs, prefix, f"resolves to \"{os.path.realpath(home / '.ssh')}\"")


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("/", "is the sensitive path /"),
        ("/etc", "is the sensitive path /etc"),
        ("/etc/ssl", "is inside the sensitive path /etc"),
        ("/proc", "sensitive path /proc"),
        ("/sys", "sensitive path /sys"),
        ("/dev", "sensitive path /dev"),
        ("/run", "sensitive path /run"),
        ("/var/run/docker.sock", "sensitive path"),
        ("/run/podman", "sensitive path /run"),
        ("/root", "is the sensitive path /root"),
        ("/boot", "sensitive path /boot"),
    ],
)
def test_system_paths_are_refused(tmp_path: Path, source: str, fragment: str) -> None:
    probs = refused(write(tmp_path, mount_profile(source)))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", fragment)


@pytest.mark.parametrize(
    "rel", [".ssh", ".gnupg", ".aws", ".kube", ".docker", ".config/containers", ".config/linpodx"]
)
def test_home_secrets_are_refused(home: Path, tmp_path: Path, rel: str) -> None:
    (home / rel).mkdir(parents=True)
    probs = refused(write(tmp_path, mount_profile(f"${{HOME}}/{rel}")))
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "is the sensitive path"
    )


@pytest.mark.parametrize(
    ("cache", "token"),
    [
        (".cargo", ".cargo/credentials.toml"),
        (".cargo", ".cargo/credentials"),
        (".gradle", ".gradle/gradle.properties"),
        (".m2", ".m2/settings.xml"),
        (".gem", ".gem/credentials"),
        (".terraform.d", ".terraform.d/credentials.tfrc.json"),
    ],
)
def test_a_package_cache_that_holds_a_registry_token_is_refused(
    home: Path, tmp_path: Path, cache: str, token: str
) -> None:
    """Mounting `~/.cargo` or `~/.gradle` to share a package cache with the agent is what a
    new user does for speed: it handed the agent the crates.io (or Maven, RubyGems,
    Terraform) publishing token in the same tree. `~/.cargo/registry` is still fine."""
    (home / token).parent.mkdir(parents=True, exist_ok=True)
    (home / token).write_text("token = \"secret\"\n")
    (home / cache / "registry").mkdir()
    probs = refused(write(tmp_path, mount_profile(f"${{HOME}}/{cache}")))
    assert_problem(
        probs,
        f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
        f"contains the sensitive path {os.path.realpath(home)}/{cache}/",
    )
    load_file(write(tmp_path, mount_profile(f"${{HOME}}/{cache}/registry")))


def test_home_as_a_whole_is_refused_because_it_contains_ssh(home: Path, tmp_path: Path) -> None:
    probs = refused(write(tmp_path, mount_profile("${HOME}")))
    assert_problem(
        probs,
        f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
        f"contains the sensitive path {os.path.realpath(home)}/.ssh",
    )


def test_linpodx_state_dir_is_refused(home: Path, tmp_path: Path) -> None:
    state = paths.ensure_dir(paths.state_dir())
    probs = refused(write(tmp_path, mount_profile(str(state / "audit").replace("/audit", ""))))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "sensitive path")
    probs = refused(write(tmp_path, mount_profile(str(home / ".local" / "state"))))
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "contains the sensitive path"
    )


@pytest.mark.parametrize("elsewhere", ["LINPODX_STATE_DIR", "XDG_STATE_HOME"])
def test_default_state_dir_is_refused_while_another_is_in_use(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, elsewhere: str
) -> None:
    # The person's own state (audit logs, approvals) stays where it was when a profile is
    # applied with the state dir pointed elsewhere.
    monkeypatch.delenv("XDG_STATE_HOME")
    default = home / ".local" / "state" / "linpodx"
    default.mkdir(parents=True)
    monkeypatch.setenv(elsewhere, str(tmp_path / "other"))
    assert paths.state_root() != str(default)
    probs = refused(write(tmp_path, mount_profile(str(default))))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
                   f"is the sensitive path {default}")


def test_xdg_state_dir_is_refused_while_an_override_is_in_use(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xdg = tmp_path / "xdg-state"
    (xdg / "linpodx").mkdir(parents=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(xdg))
    monkeypatch.setenv("LINPODX_STATE_DIR", str(tmp_path / "override"))
    probs = refused(write(tmp_path, mount_profile(str(xdg / "linpodx"))))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
                   f"is the sensitive path {xdg / 'linpodx'}")
    assert str(tmp_path / "override") in paths.protected_roots()


def test_another_homes_state_dir_is_a_home_secret() -> None:
    from linpodx.profile import hostpaths

    trees, _exact = hostpaths.sensitive_paths()
    assert "/root/.local/state/linpodx" in trees


def _accounts(tmp_path: Path) -> list[object]:
    import pwd

    other = tmp_path / "other-home"
    (other / ".local" / "share" / "containers").mkdir(parents=True)
    (other / "project").mkdir()
    system = tmp_path / "usr-sbin"  # a system account's "home" it does not own
    system.mkdir()
    uid = os.getuid()
    return [
        pwd.struct_passwd(("person", "x", uid, uid, "", str(other), "/bin/sh")),
        pwd.struct_passwd(("daemon", "x", uid + 1 if uid < 999 else 1, 1, "", str(system),
                           "/usr/sbin/nologin")),
        pwd.struct_passwd(("gone", "x", 1002, 1002, "", "/nonexistent/x", "/bin/sh")),
    ]


def test_as_root_other_homes_and_their_secrets_are_refused(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pwd

    from linpodx.profile import hostpaths

    accounts = _accounts(tmp_path)
    monkeypatch.setattr(pwd, "getpwall", lambda: accounts)
    monkeypatch.setattr(hostpaths.os, "geteuid", lambda: 0)
    other = tmp_path / "other-home"
    probs = refused(write(tmp_path, mount_profile(str(other))))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
                   f"contains the sensitive path {other}/.ssh")
    store = other / ".local" / "share" / "containers"
    probs = refused(write(tmp_path, mount_profile(str(store))))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
                   f"is the sensitive path {store}")
    # A project inside it is fine, as in one's own home; so is a system account's "home".
    assert load_text(mount_profile(str(other / "project")), "t.yml").mounts
    assert load_text(mount_profile(str(tmp_path / "usr-sbin")), "t.yml").mounts


def test_other_homes_are_not_looked_up_without_root(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pwd

    from linpodx.profile import hostpaths

    accounts = _accounts(tmp_path)
    monkeypatch.setattr(pwd, "getpwall", lambda: accounts)
    monkeypatch.setattr(hostpaths.os, "geteuid", lambda: 1000)
    assert str(tmp_path / "other-home") not in hostpaths._home_dirs()


def test_relative_source_is_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, mount_profile("project/src")))
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "must be an absolute path"
    )


def test_dotdot_is_refused_not_normalized(home: Path, tmp_path: Path) -> None:
    probs = refused(write(tmp_path, mount_profile("${HOME}/project/../project")))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "must not contain `..`")


def test_missing_source_is_refused(home: Path, tmp_path: Path) -> None:
    probs = refused(write(tmp_path, mount_profile("${HOME}/nope")))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "does not exist")


def test_colon_and_comma_in_source_are_refused(home: Path, tmp_path: Path) -> None:
    (home / "a,b").mkdir()
    probs = refused(write(tmp_path, mount_profile("'${HOME}/a,b'")))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "`:`, `,` or `\"`")


@pytest.mark.parametrize("name", ["a,b=c", "x:y", "nl\ndir", 'q"x', "tab\tdir"])
def test_source_resolving_to_a_path_podman_cannot_take_is_refused(
    home: Path, tmp_path: Path, name: str
) -> None:
    # Written without the character, resolved through a symlink with it: stored, every run
    # failed.
    (home / name).mkdir()
    (home / "link").symlink_to(home / name)
    probs = refused(write(tmp_path, mount_profile("${HOME}/link")))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
                   "which contains control characters, `:`, `,` or `\"`")


def test_double_quote_in_source_or_target_is_refused(home: Path, tmp_path: Path) -> None:
    # podman parses --mount as CSV: a bare `"` makes every run fail.
    (home / 'q"x').mkdir()
    probs = refused(write(tmp_path, mount_profile("'${HOME}/q\"x'", "'/w\"x'")))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "`,` or `\"`")
    assert_problem(probs, f"{tmp_path / 'p.yml'}:5:13: mounts[0].target:", "`,` or `\"`")


def test_socket_source_is_refused(home: Path, tmp_path: Path) -> None:
    import socket

    sock_path = home / "project" / "agent.sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock_path))
        probs = refused(write(tmp_path, mount_profile(str(sock_path))))
    finally:
        s.close()
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "not a directory or regular file"
    )


def test_directory_holding_a_socket_is_refused(home: Path, tmp_path: Path) -> None:
    # A tmux or X server socket one level down is as good as the socket itself.
    import socket

    d = home / "project" / "tmux-1000"
    d.mkdir()
    (d / "sub").mkdir()
    (d / "link").symlink_to("/tmp")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(d / "default"))
        probs = refused(write(tmp_path, mount_profile(str(d))))
        assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
                       f"holds the socket \"{d / 'default'}\"")
        # One level only: the parent, whose direct entries are no sockets, is fine.
        assert load_text(mount_profile(str(home / "project")), "t.yml").mounts
    finally:
        s.close()


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("/tmp/.X11-unix", "is the sensitive path /tmp/.X11-unix"),
        ("/tmp/.X11-unix/X0", "inside the sensitive path /tmp/.X11-unix"),
        ("/tmp/tmux-1000", "tmux socket directory"),
        ("/tmp/tmux-0/default", "tmux socket directory"),
        ("/tmp", "contains the sensitive path /tmp/.X11-unix"),
    ],
)
def test_desktop_and_tmux_sockets_are_sensitive(
    tmp_path: Path, source: str, fragment: str
) -> None:
    probs = refused(write(tmp_path, mount_profile(source)))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", fragment)


def test_tmux_tmpdir_socket_directory_is_sensitive(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmux = home / "project" / f"tmux-{os.getuid()}"
    tmux.mkdir()
    monkeypatch.setenv("TMUX_TMPDIR", str(home / "project"))
    probs = refused(write(tmp_path, mount_profile(str(tmux))))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:",
                   f"is the sensitive path {tmux}")


# --- mount targets ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("/", "is not allowed"),
        ("/proc", "is over /proc"),
        ("/proc/self", "is over /proc"),
        ("/sys/fs", "is over /sys"),
        ("/dev", "is over /dev"),
        ("/etc/resolv.conf", "linpodx manages it"),
        ("/etc/hosts", "linpodx manages it"),
        # Would hold the mount gate (linpodx.podman.mountpin).
        ("/run", "linpodx manages it"),
        ("/run/linpodx", "is over /run/linpodx"),
        ("/run/linpodx/mount-gate", "is over /run/linpodx"),
        # linpodx's $HOME: a tmpfs in --rm containers (a second mount there is a duplicate
        # destination), and its parent (the tmpfs's mount point would be made in the host path).
        ("/home/agent", "linpodx manages it"),
        ("/home", "linpodx manages it"),
        ("workspace", "must be an absolute path"),
        ("/w/../proc", "must not contain `..`"),
        ("/w/./x", "is not normalized"),
    ],
)
def test_bad_targets_are_refused(home: Path, tmp_path: Path, target: str, fragment: str) -> None:
    probs = refused(write(tmp_path, mount_profile("${HOME}/project", target)))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:5:13: mounts[0].target:", fragment)


def test_target_inside_the_container_home_is_allowed(home: Path) -> None:
    p = load_text(mount_profile("${HOME}/project", "/home/agent/work"), "t.yml")
    assert p.mounts[0].target == "/home/agent/work"


def test_duplicate_targets_are_refused(home: Path, tmp_path: Path) -> None:
    text = (
        "name: p\nmounts:\n  - {source: '${HOME}/project', target: /w}\n"
        "  - {source: '${HOME}/project', target: /w}\n"
    )
    probs = refused(write(tmp_path, text))
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:4:41: mounts[1].target:", "already used by mounts[0]"
    )


# --- YAML structure -------------------------------------------------------------------------


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: a\ndescription: x\nname: b\n"))
    assert probs == [f"{tmp_path / 'p.yml'}:3:1: name: duplicate key \"name\" (first at line 1, "
                     "column 1)"]


def test_nested_duplicate_keys_are_refused(tmp_path: Path) -> None:
    text = "name: a\nnetwork:\n  allow_private_answers: false\n  allow_private_answers: true\n"
    probs = refused(write(tmp_path, text))
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:4:3: network.allow_private_answers:", "duplicate key"
    )


def test_unknown_keys_are_refused_with_a_suggestion(tmp_path: Path) -> None:
    text = "name: a\nnetwork:\n  egress_allowlist: [crates.io]\nmounts: []\nbogus: 1\n"
    with pytest.raises(ProfileError) as exc:
        load_file(write(tmp_path, text))
    probs = list(exc.value.problems)
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:3:3: network.egress_allowlist:", "unknown key"
    )
    assert_problem(probs, f"{tmp_path / 'p.yml'}:5:1: bogus:", "unknown key \"bogus\"")
    assert "did you mean `egress_dns_allowlist`?" in (exc.value.hint or "")


@pytest.mark.parametrize(
    ("text", "prefix", "fragment"),
    [
        ("name: 3\n", "1:7: name:", "expected a string, got an integer"),
        ("name: a\nmounts: {}\n", "2:9: mounts:", "expected a list, got a mapping"),
        ("name: a\nmcp: {approval_timeout_seconds: '30'}\n", "2:33: mcp.approval_timeout_seconds:",
         "expected an integer, got a string"),
        ("name: a\nmcp: {approval_timeout_seconds: 0}\n", "2:33: mcp.approval_timeout_seconds:",
         "out of range"),
        ("name: a\nenv: {DEBUG: true}\n", "2:14: env.DEBUG:", "expected a string, got a boolean"),
        ("name: a\nenv: {1BAD: x}\n", "2:7: env.1BAD:", "not a valid environment variable"),
        ("name: Bad\n", "1:7: name:", "is not valid here"),
        ("description: x\n", "1:1:", "missing required key \"name\""),
        ("name: a\nresources: {nofile: 2000000}\n", "2:21: resources.nofile:", "out of range"),
        ("name: a\nresources: {memory: 1m}\n", "2:21: resources.memory:", "out of range"),
        ("name: a\nresources: {cpus: 0}\n", "2:19: resources.cpus:", "out of range"),
        ("name: a\nworkdir: rel\n", "2:10: workdir:", "absolute"),
        ("name: a\nworkdir: \"/w\\n\"\n", "2:10: workdir:", "or control characters"),
        ("name: a\nworkdir: \"/w\\tx\"\n", "2:10: workdir:", "or control characters"),
        ("version: 2\nname: a\n", "1:10: version:", "version 2 is not supported"),
    ],
)
def test_wrong_types_and_values(tmp_path: Path, text: str, prefix: str, fragment: str) -> None:
    probs = refused(write(tmp_path, text))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:{prefix}", fragment)


def test_all_problems_are_collected(tmp_path: Path) -> None:
    text = "name: A\nbogus: 1\naudit: {hash_chain: false}\ncap_add: [SYS_ADMIN]\n"
    probs = refused(write(tmp_path, text))
    assert len(probs) == 4
    assert [p.split(": ")[0].rsplit(":", 2)[1] for p in probs] == ["1", "2", "3", "4"]


def test_billion_laughs_is_refused_without_expanding(tmp_path: Path) -> None:
    lines = ['name: x', 'lol0: &lol0 "lol"']
    # 30 levels of 10 aliases each: 10^30 strings if anything expanded it. Finishing at all
    # shows nothing did (no timing assertion needed).
    for i in range(1, 31):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 10) + "]")
    probs = refused(write(tmp_path, "\n".join(lines) + "\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:7: lol0:", "anchors and aliases are not allowed")
    assert all("anchors and aliases" in p for p in probs)
    with pytest.raises(ProfileError) as exc:
        load_file(tmp_path / "p.yml")
    assert "alias bombs" in (exc.value.hint or "")


def test_single_alias_is_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: &n a\ndescription: *n\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:1:7: name:", "anchors and aliases")


def test_merge_keys_are_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: a\nnetwork:\n  <<: {allow_private_answers: true}\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:3: network:", "merge keys (<<) are not allowed")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("name: !!python/object/apply:os.system [true]\n", "YAML tag"),
        ("name: a\ndescription: !custom x\n", "YAML tag !custom is not allowed"),
    ],
)
def test_custom_tags_are_refused(tmp_path: Path, text: str, fragment: str) -> None:
    probs = refused(write(tmp_path, text))
    assert any(fragment in p for p in probs), probs


def test_multiple_documents_are_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: a\n---\nname: b\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:1:", "more than one YAML document")


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "- name: a\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:1:1:", "top level must be a mapping")


def test_empty_file_is_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "# nothing\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:1:1:", "empty")


def test_file_over_one_mib_is_refused_before_parsing(tmp_path: Path) -> None:
    f = tmp_path / "big.yml"
    head = b"name: a\n"
    # Invalid YAML after the size bound: it is refused for its size, never parsed.
    f.write_bytes(head + b"#" * (MAX_BYTES - len(head)) + b"[")
    assert f.stat().st_size == MAX_BYTES + 1
    with pytest.raises(ProfileError) as exc:
        load_file(f)
    assert "larger than 1048576 bytes" in exc.value.message
    assert "refused before parsing" in exc.value.message


def test_file_of_exactly_one_mib_is_read(tmp_path: Path) -> None:
    f = tmp_path / "edge.yml"
    head = b"name: a\n#"
    f.write_bytes(head + b"x" * (MAX_BYTES - len(head) - 1) + b"\n")
    assert f.stat().st_size == MAX_BYTES
    # The bound is the reader's; parsing a whole MiB in pure Python only costs test time.
    assert len(loader.read_profile_text(f)) == MAX_BYTES


def test_too_many_nodes_are_refused(tmp_path: Path) -> None:
    text = "name: a\nx: [" + ", ".join("1" for _ in range(10_100)) + "]\n"
    probs = refused(write(tmp_path, text))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:1:1:", "more than 10000 YAML nodes")


@pytest.mark.parametrize(
    ("text", "prefix", "written"),
    [
        ("name: a\nresources: {nofile: 1e3}\n", "2:21: resources.nofile:", "1e3"),
        ("name: a\nresources: {pids_limit: 1.6e1}\n", "2:25: resources.pids_limit:", "1.6e1"),
        ("name: a\nresources:\n  nproc: 100.0\n", "3:10: resources.nproc:", "100.0"),
        ("name: a\nmcp: {approval_timeout_seconds: 1.0}\n",
         "2:33: mcp.approval_timeout_seconds:", "1.0"),
        ("name: a\nmcp: {max_line_bytes: 2048.0}\n", "2:23: mcp.max_line_bytes:", "2048.0"),
        ("name: a\nresources: {nofile: 1e9}\n", "2:21: resources.nofile:", "1e9"),
    ],
)
def test_floats_are_refused_where_an_integer_is_wanted(
    tmp_path: Path, text: str, prefix: str, written: str
) -> None:
    """JSON Schema counts 1.0 and 1e3 as integers; the store cannot hash a float, so the loader
    refuses them itself (before, `validate` said OK and `apply` failed without a position)."""
    f = write(tmp_path, text)
    with pytest.raises(ProfileError) as exc:
        load_file(f)
    probs = list(exc.value.problems)
    wanted = "an integer or null" if "pids_limit" in prefix else "an integer"  # null: unset
    assert probs == [
        f"{f}:{prefix} expected {wanted}, got the floating-point number `{written}`"
    ]  # one problem: no "out of range" noise for 1e9
    assert "without a decimal point or exponent" in (exc.value.hint or "")


@pytest.mark.parametrize(
    ("written", "stored"),
    [("1.5", "1.5"), ("2.0", "2"), ("1e3", "1000"), (".25", "0.25"), ("2", "2"), ("'0.5'", "0.5")],
)
def test_cpus_takes_a_float_and_stores_a_decimal_string(
    tmp_path: Path, written: str, stored: str
) -> None:
    p = load_file(write(tmp_path, f"name: a\nresources: {{cpus: {written}}}\n"))
    assert p.resources.cpus == stored


def test_cpus_is_judged_as_written_not_as_the_rounded_float(tmp_path: Path) -> None:
    # float("0.1000000000000000001") == 0.1, which has one decimal; the text has 19.
    probs = refused(write(tmp_path, "name: a\nresources: {cpus: 0.1000000000000000001}\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:19: resources.cpus:", "more than 3 decimals")


@pytest.mark.parametrize(
    ("text", "pos"),
    [
        ("name: a\ndescription: " + "[" * 500 + "]" * 500 + "\n", "2:45"),
        ("name: a\ndescription: " + "{a: " * 500 + "}" * 500 + "\n", "2:138"),
        (
            "name: a\ndescription:\n"
            + "".join(" " * (2 * i) + "a:\n" for i in range(1, 500))
            + " " * 1000 + "a: 1\n",
            "34:65",
        ),
        ("name: a\ndescription:\n" + "".join(" " * (2 * i) + "-\n" for i in range(1, 500)),
         "34:65"),
        ("name: a\ndescription: " + "[" * 400_000 + "]" * 400_000 + "\n", "2:45"),
    ],
    ids=["flow-lists", "flow-mappings", "block-mappings", "block-lists", "1-mib"],
)
def test_deep_nesting_is_refused_before_composing(tmp_path: Path, text: str, pos: str) -> None:
    """Before: ruamel's composer recursed once per level and died with RecursionError (exit 70)
    at ~500 levels, well inside the 10,000-node bound."""
    f = write(tmp_path, text)
    probs = refused(f)
    assert probs == [
        f"{f}:{pos}: mappings and lists are nested more than {loader.MAX_DEPTH} levels deep; "
        "refused"
    ]


def test_nesting_up_to_the_bound_gets_ordinary_messages(tmp_path: Path) -> None:
    depth = loader.MAX_DEPTH - 1  # plus the top-level mapping
    probs = refused(write(tmp_path, "name: a\ndescription: " + "[" * depth + "]" * depth + "\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:14: description:", "expected a string")


def test_recursion_in_the_composer_is_a_clean_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback if some nesting ever got past the bound: a refusal, not an internal error."""
    from ruamel.yaml import YAML

    def deep(self: object, text: str) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(YAML, "compose", deep)
    probs = refused(write(tmp_path, "name: a\n"))
    assert probs == [f"{tmp_path / 'p.yml'}:1:1: the YAML is nested too deeply to read; refused"]


def test_invalid_utf8_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "p.yml"
    f.write_bytes(b"name: a\ndescription: caf\xe9\n")
    probs = refused(f)
    assert_problem(probs, f"{f}:2:17:", "invalid UTF-8")


def test_control_characters_are_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: a\ndescription: a\x1b[31mb\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:15:", "unacceptable character")


@pytest.mark.parametrize(
    ("escape", "code"),
    [("\\e[31m", "U+001B"), ("\\x9b", "U+009B"), ("\\ud800", "U+D800"), ("\\u2028", "U+2028")],
)
def test_escaped_control_characters_are_refused(tmp_path: Path, escape: str, code: str) -> None:
    # The YAML reader refuses these raw, but double-quoted escapes produce them.
    probs = refused(write(tmp_path, f'name: a\ndescription: "x{escape}"\n'))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:14: description:", f"control characters "
                   f"or lone surrogates ({code})")


def test_expanded_control_characters_are_refused() -> None:
    with pytest.raises(ProfileError) as exc:
        load_text("name: a\nenv: {A: '${LINPODX_VAR_X}'}\n", "t.yml",
                  env={"LINPODX_VAR_X": "a\x1bb"})
    assert exc.value.problems[0].startswith("t.yml:2:10: env.A: strings must not contain")


def test_read_only_yes_is_refused_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as exc:
        load_file(write(tmp_path, "name: a\nmounts: [{source: /x, target: /y, read_only: no}]\n"))
    assert any(":2:46: mounts[0].read_only: expected true or false, got a string" in p
               for p in exc.value.problems), exc.value.problems
    assert "write true or false" in (exc.value.hint or "")


@pytest.mark.parametrize("text", ["yes", "on", "'1'", '"false "', "y", "1"])
def test_bool_tag_takes_only_yaml_1_2_spellings(tmp_path: Path, text: str) -> None:
    # `!!bool yes` used to load as false: a read-only mount made writable (fail-open).
    probs = refused(write(tmp_path, f"name: a\nmounts: [{{source: /x, target: /y, "
                                    f"read_only: !!bool {text}}}]\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:46: mounts[0].read_only:",
                   "tagged !!bool is not a YAML boolean")
    assert not any("got null" in p for p in probs), probs


@pytest.mark.parametrize(("text", "value"), [("TRUE", True), ("True", True), ("False", False)])
def test_bool_tag_with_a_core_spelling_loads(text: str, value: bool) -> None:
    p = load_text(f"name: a\nnetwork: {{allow_private_answers: !!bool {text}}}\n", "t.yml")
    assert p.network.allow_private_answers is value


def test_null_tag_takes_only_null_spellings(tmp_path: Path) -> None:
    # `tool_name: !!null delete_file` would be a rule for every tool.
    probs = refused(write(tmp_path, "name: a\nmcp_policy:\n  - {method: tools/call, "
                                    "tool_name: !!null delete_file, decision: auto_allow}\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:37: mcp_policy[0].tool_name:",
                   "tagged !!null is not a YAML null")
    p = load_text("name: a\nmcp_policy: [{method: x, tool_name: !!null '', decision: deny}]\n")
    assert p.mcp_policy[0].tool_name is None


@pytest.mark.parametrize("version", ["1.1", "1.0", "1.3", "2.0", "1.2.0", ""])
def test_yaml_versions_other_than_1_2_are_refused(tmp_path: Path, version: str) -> None:
    # Under %YAML 1.1 `yes` is true and `0777` octal: the file means what a reader would not.
    probs = refused(write(tmp_path, f"# c\n%YAML {version}\n---\nname: a\n"
                                    "mounts: [{source: /x, target: /y, read_only: yes}]\n"))
    assert probs == [f"{tmp_path / 'p.yml'}:2:1: YAML version \"{version}\" is not supported: a "
                     "profile is YAML 1.2"]
    assert load_text("%YAML 1.2\n---\nname: a\n", "t.yml").name == "a"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('name: "abc\\n"\n', "1:7: name:"),
        ('name: a\nresources: {memory: "2g\\n"}\n', "2:21: resources.memory:"),
        ('name: a\nresources: {cpus: "2\\n"}\n', "2:19: resources.cpus:"),
        ('name: a\nmcp_policy: [{method: "tools/call\\n", decision: deny}]\n',
         "2:23: mcp_policy[0].method:"),
        ("name: a\nmcp_policy:\n- method: tools/call\n  tool_name: |\n    delete_file\n"
         "  decision: deny\n", "4:14: mcp_policy[0].tool_name:"),
        ('name: a\nmcp: {allow_server_requests: ["sampling/createMessage\\n"]}\n',
         "2:31: mcp.allow_server_requests[0]:"),
        ('name: a\ncap_add: ["CHOWN\\n"]\n', "2:11: cap_add[0]:"),
    ],
)
def test_pattern_dollar_does_not_match_before_a_trailing_newline(
    tmp_path: Path, text: str, where: str
) -> None:
    # Python's `$` matches before a final newline; JSON Schema's (ECMA-262) does not.
    probs = refused(write(tmp_path, text))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:{where}", "is not valid here (must match")


def test_env_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, 'name: a\nenv: {"X\\n": v}\n'))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:7: env[", "not a valid environment variable")


def test_every_schema_pattern_is_anchored_at_the_very_end() -> None:
    def walk(node: object) -> list[str]:
        if isinstance(node, dict):
            found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
            return found + [p for v in node.values() for p in walk(v)]
        if isinstance(node, list):
            return [p for v in node for p in walk(v)]
        return []

    patterns = walk(loader.schema())
    assert len(patterns) >= 8
    for pattern in patterns:
        assert pattern.startswith("^") and pattern.endswith("$"), pattern
        assert schemapass._anchored(pattern).pattern.endswith(r"\Z")


def test_a_revision_stored_under_the_old_pattern_rule_is_checked_again() -> None:
    import hashlib

    good = load_text("name: a\nmcp_policy: [{method: tools/call, tool_name: x, decision: deny}]\n")
    data = good.to_dict()
    data["mcp_policy"][0]["tool_name"] = "delete_file\n"
    old = "sha256:" + hashlib.sha256(
        (REPO / "linpodx" / "profile" / "schema.json").read_bytes()
    ).hexdigest()
    with pytest.raises(ProfileError) as exc:
        profile_from_dict(data, "rev.json", validated_with=old)
    assert any("mcp_policy[0].tool_name" in p for p in exc.value.problems), exc.value.problems


def test_memory_that_is_not_a_size_is_refused_without_the_schema() -> None:
    data = load_text("name: a\n").to_dict()
    data["resources"]["memory"] = "2g\n"
    with pytest.raises(ProfileError) as exc:
        profile_from_dict(data, "rev.json", validated_with=loader.schema_digest())
    assert any("is not a memory size" in p for p in exc.value.problems), exc.value.problems


def test_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as exc:
        load_file(tmp_path)
    assert "not a regular file" in exc.value.message
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError) as exc:
        load_file(fifo)  # must not block waiting for a writer
    assert "not a regular file" in exc.value.message
    with pytest.raises(NotFound) as exc:
        load_file(tmp_path / "missing.yml")
    assert "not found" in exc.value.message


# --- ${VAR} ---------------------------------------------------------------------------------


def test_unknown_var_is_refused_with_position(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: a\ndescription: 'x ${LINPODX_VAR_TEST_UNSET}'\n"))
    assert probs == [
        f"{tmp_path / 'p.yml'}:2:14: description: environment variable LINPODX_VAR_TEST_UNSET "
        "is not set"
    ]


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        ("${LINPODX_VAR_A}", {"LINPODX_VAR_A": "1"}, "1"),
        ("${LINPODX_VAR_A:-d}", {}, "d"),
        ("${LINPODX_VAR_A:-d}", {"LINPODX_VAR_A": ""}, "d"),
        ("${LINPODX_VAR_A}", {"LINPODX_VAR_A": ""}, ""),
        ("$${A}", {}, "${A}"),
        ("a$$b", {}, "a$b"),
        ("${HOME}${LINPODX_VAR_B:-}x", {"HOME": "/h"}, "/hx"),
        ("${XDG_RUNTIME_DIR:-/run/user/1}/x", {}, "/run/user/1/x"),
        ("${USER}${LOGNAME}${PWD}", {"USER": "u", "LOGNAME": "l", "PWD": "/p"}, "ul/p"),
    ],
)
def test_expansion_forms(value: str, env: dict[str, str], expected: str) -> None:
    out, problems = loader.expand_vars(value, env)
    assert problems == []
    assert out == expected


@pytest.mark.parametrize(
    "value", ["${SECRET_TOKEN}", "${SECRET_TOKEN:-x}", "${PATH}", "${LINPODX_VAR_}", "${home}",
              "${LINPODX_STATE_DIR}"]
)
def test_only_a_fixed_set_of_host_variables_is_expanded(value: str) -> None:
    # A hostile profile must not copy the host's environment into the container (or a DNS name).
    env = {"SECRET_TOKEN": "s3cret", "PATH": "/bin", "home": "/h", "LINPODX_VAR_": "x",
           "LINPODX_STATE_DIR": "/s"}
    out, problems = loader.expand_vars(value, env)
    assert len(problems) == 1
    message, hint = problems[0]
    assert "is not expanded: a profile may only use HOME, USER" in message
    assert "LINPODX_VAR_*" in message
    assert "`export LINPODX_VAR_" in hint and "and write `${LINPODX_VAR_" in hint
    assert "s3cret" not in out and "/bin" not in out


def test_a_host_secret_never_reaches_env_or_the_allowlist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "s3cret")
    text = ('name: a\nenv:\n  STOLEN: "${SECRET_TOKEN}"\nnetwork:\n'
            '  egress_dns_allowlist: ["${SECRET_TOKEN}.attacker.example"]\n')
    probs = refused(write(tmp_path, text))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:11: env.STOLEN:",
                   "`${SECRET_TOKEN}` is not expanded")
    assert_problem(probs, f"{tmp_path / 'p.yml'}:5:26: network.egress_dns_allowlist[0]:",
                   "`${SECRET_TOKEN}` is not expanded")
    assert not any("s3cret" in p for p in probs)
    monkeypatch.setenv("LINPODX_VAR_TOKEN", "opted-in")
    p = load_text('name: a\nenv: {T: "${LINPODX_VAR_TOKEN}"}\n', "t.yml")
    assert p.env == (("T", "opted-in"),)


@pytest.mark.parametrize("value", ["$A", "${A", "${}", "${1A}", "${A:=x}", "cost: 5$"])
def test_other_dollar_forms_are_refused(value: str) -> None:
    _out, problems = loader.expand_vars(value, {"A": "1"})
    assert problems and "$$" in problems[0][1]


def test_expansion_happens_before_path_checks(home: Path, tmp_path: Path) -> None:
    probs = refused(write(tmp_path, mount_profile("${LINPODX_VAR_SRC:-/etc}")))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:4:13: mounts[0].source:", "sensitive path /etc")
    p = load_text(mount_profile("${LINPODX_VAR_SRC}"), "t.yml",
                  env={"LINPODX_VAR_SRC": str(home / "project")})
    assert p.mounts[0].source == os.path.realpath(home / "project")


def test_keys_are_not_expanded(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: a\nenv: {'${X}': y}\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:2:7: env[\"${{X}}\"]:", "not a valid environment")


# --- hostnames, policy, audit, capabilities ----------------------------------------------------


@pytest.mark.parametrize(
    ("host", "fragment"),
    [
        ("*", "leading `*.`"),
        ("*.com", "at least two labels"),
        ("a.*.com", "leading `*.`"),
        ("*foo.com", "leading `*.`"),
        ("**.foo.com", "leading `*.`"),
        ("1.2.3.4", "IP address"),
        ("[::1]", "IP address"),
        ("localhost", "at least two labels"),
        ("exa_mple.com", "letters, digits and inner hyphens"),
        ("-a.com", "letters, digits and inner hyphens"),
        ("a..com", "empty label"),
        ("a" * 64 + ".com", "longer than 63"),
        (".".join(["a" * 63] * 3 + ["a" * 62]), "longer than 253"),
        ("bücher.de", "xn--"),
        # Lower-cased, the Kelvin sign is `k`: checked for ASCII before lower-casing.
        ("\u212aexample.com", "is not ASCII (U+212A)"),
        ("*.\u0130stanbul.example", "is not ASCII"),
        ("example.123", "IP address"),
    ],
)
def test_bad_hostnames_are_refused(tmp_path: Path, host: str, fragment: str) -> None:
    text = f"name: a\nnetwork:\n  egress_dns_allowlist:\n    - '{host}'\n"
    probs = refused(write(tmp_path, text))
    assert_problem(
        probs, f"{tmp_path / 'p.yml'}:4:7: network.egress_dns_allowlist[0]:", fragment
    )


def test_duplicate_hostnames_are_refused(tmp_path: Path) -> None:
    text = "name: a\nnetwork:\n  egress_dns_allowlist: [crates.io, CRATES.io.]\n"
    probs = refused(write(tmp_path, text))
    assert_problem(
        probs,
        f"{tmp_path / 'p.yml'}:3:37: network.egress_dns_allowlist[1]:",
        "listed twice",
    )


@pytest.mark.parametrize(
    ("rule", "prefix", "fragment"),
    [
        ("{method: tools/call, decision: allow}", "3:36: mcp_policy[0].decision:",
         "is not one of: auto_allow, prompt, deny"),
        ("{method: tools/call, decision: AUTO_ALLOW}", "3:36: mcp_policy[0].decision:",
         "is not one of"),
        ("{method: tools/call}", "3:5: mcp_policy[0]:", "missing required key \"decision\""),
        ("{method: '', decision: deny}", "3:14: mcp_policy[0].method:", "is not valid here"),
        ("{method: 'tools/call ', decision: deny}", "3:14: mcp_policy[0].method:",
         "is not valid here"),
        ("{method: 'tools\uff0fcall', decision: deny}", "3:14: mcp_policy[0].method:",
         "is not valid here"),
        ("{method: resources/read, tool_name: x, decision: deny}",
         "3:41: mcp_policy[0].tool_name:", "only applies to method tools/call"),
        ("{method: tools/call, decision: deny, when: always}", "3:42: mcp_policy[0].when:",
         "unknown key"),
    ],
)
def test_bad_policy_rules_are_refused(
    tmp_path: Path, rule: str, prefix: str, fragment: str
) -> None:
    probs = refused(write(tmp_path, f"name: a\nmcp_policy:\n  - {rule}\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:{prefix}", fragment)


def test_hash_chain_false_is_refused(tmp_path: Path) -> None:
    probs = refused(write(tmp_path, "name: a\naudit:\n  hash_chain: false\n"))
    assert probs == [
        f"{tmp_path / 'p.yml'}:3:15: audit.hash_chain: hash_chain: false is refused: linpodx "
        "always keeps the audit hash chain (fail closed)"
    ]


@pytest.mark.parametrize(
    ("cap", "fragment"),
    [
        ("SYS_ADMIN", "capability SYS_ADMIN is refused"),
        ("cap_net_admin", "capability NET_ADMIN is refused"),
        ("NET_RAW", "is refused"),
        ("SYS_PTRACE", "is refused"),
        ("BPF", "is refused"),
        # A write to a setuid file already in a writable mount would keep its bit.
        ("FSETID", "capability FSETID is refused"),
        ("MAKE_COFFEE", "unknown capability"),
    ],
)
def test_bad_capabilities_are_refused(tmp_path: Path, cap: str, fragment: str) -> None:
    probs = refused(write(tmp_path, f"name: a\ncap_add:\n  - {cap}\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:5: cap_add[0]:", fragment)


def test_bad_resolvers_are_refused(tmp_path: Path) -> None:
    text = "name: a\nnetwork:\n  upstream_dns: ['192.0.2.1:0', 'dns.example', '[::1']\n"
    probs = refused(write(tmp_path, text))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:18: network.upstream_dns[0]:", "port")
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:33: network.upstream_dns[1]:", "is not `IP`")
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:48: network.upstream_dns[2]:", "is not `IP`")


@pytest.mark.parametrize("resolver", ["fe80::1%eth0", "[fe80::1%eth0]:53", "fe80::1%a b",
                                      "[fe80::1%$$x]:53", "fe80::1%25eth0"])
def test_ipv6_zone_ids_are_refused(tmp_path: Path, resolver: str) -> None:
    probs = refused(write(tmp_path, f"name: a\nnetwork:\n  upstream_dns: ['{resolver}']\n"))
    assert_problem(probs, f"{tmp_path / 'p.yml'}:3:18: network.upstream_dns[0]:",
                   "zone ids (`%eth0`) are not allowed")

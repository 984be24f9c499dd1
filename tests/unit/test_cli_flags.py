"""CLI consistency: one spelling per concept, deprecated aliases, serve's port and address,
and option descriptions on ``--choice``."""

from __future__ import annotations

import argparse
import socket
from typing import Any

import pytest

from clef_agents.cli import build_parser, main
from clef_agents.cli.decide import collect_questions, parse_options

DEPRECATED = {"--column": "--text-col", "--quiet": "--no-progress", "--diagram": "--plot"}
"""Old spelling -> the one every subcommand uses now."""

ALIASES = [
    ("batch", ["x.csv", "--questions", "q.json", "--out", "o.parquet"], "--column", "body"),
    ("finetune", ["x.csv", "--out", "dir"], "--quiet", None),
    ("calibrate", ["model", "x.csv"], "--diagram", "r.png"),
]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _visible_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for action in parser._actions
        if action.help is not argparse.SUPPRESS
        for flag in action.option_strings
    }


def test_every_subcommand_spells_a_concept_one_way() -> None:
    for name, sub in _subparsers().items():
        flags = _visible_flags(sub)
        assert not flags & set(DEPRECATED), (name, flags & set(DEPRECATED))
        # A state column, a progress switch and a plot are spelled as everywhere else.
        assert not {f for f in flags if f.endswith("-column") or f == "--diagram"}, name
    flags = {n: _visible_flags(p) for n, p in _subparsers().items()}
    assert {"--text-col", "--no-progress"} <= flags["batch"] & flags["eval"] & flags["finetune"]
    assert "--plot" in flags["eval"] & flags["calibrate"]
    assert "--text-col" in flags["calibrate"]


@pytest.mark.parametrize(("command", "argv", "old", "value"), ALIASES)
def test_old_spellings_still_work_with_a_one_line_warning(
    capsys: Any, command: str, argv: list[str], old: str, value: str | None
) -> None:
    new = DEPRECATED[old]
    given = [old] if value is None else [old, value]
    expected = True if value is None else value
    args = build_parser().parse_args([command, *argv, *given])
    dest = new.lstrip("-").replace("-", "_")
    got = getattr(args, dest)
    assert (got[0] if isinstance(got, list) else got) == expected
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and old in lines[0] and new in lines[0] and "deprecated" in lines[0]
    # The new spelling says nothing; the old one is hidden from --help.
    build_parser().parse_args([command, *argv, *([new] if value is None else [new, value])])
    assert capsys.readouterr().err == ""
    assert old not in _subparsers()[command].format_help()


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "http"])
def test_serve_refuses_a_port_outside_the_range(capsys: Any, port: str) -> None:
    assert main(["serve", "--port", port]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--port" in lines[0] and "65535" in lines[0]


def test_serve_prints_where_it_listens(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from clef_agents.fake import FakeEngine
    from clef_agents.server import transport

    pytest.importorskip("uvicorn")
    served: list[int] = []
    real = transport.build_server

    def build(*args: Any, **kwargs: Any) -> Any:
        server, sock = real(*args, **kwargs)
        served.append(sock.getsockname()[1])
        server.run = lambda sockets: sockets[0].close()  # bound, then stop at once
        return server, sock

    monkeypatch.setattr(transport, "build_server", build)
    monkeypatch.setattr("clef_agents.cli.serve.build_engine", lambda args: FakeEngine())
    monkeypatch.setattr("clef_agents.cli.serve.gc.freeze", lambda: None)
    assert main(["serve", "--port", "0"]) == 0
    err = capsys.readouterr().err
    port = served[0]
    assert port > 0  # port 0 picked a free one, and that one is printed
    assert f"listening on 127.0.0.1 port {port}: http://127.0.0.1:{port}/v1/systemone" in err


def test_serve_listening_line_brackets_ipv6() -> None:
    from clef_agents.cli.serve import url

    assert url("::1", 8000) == "http://[::1]:8000/v1/systemone"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        from clef_agents.cli.serve import listening

        assert listening(sock).endswith(f"http://127.0.0.1:{sock.getsockname()[1]}/v1/systemone")


def test_choice_options_with_descriptions_survive_commas_and_colons() -> None:
    assert parse_options("card_arrival,lost_card , refund", "--choice") == dict.fromkeys(
        ["card_arrival", "lost_card", "refund"]
    )
    assert parse_options("billing:payments, refunds and invoices,technical:app errors", "x") == {
        "billing": "payments, refunds and invoices",
        "technical": "app errors",
    }
    assert parse_options('{"billing": "a, b: c", "technical": null}', "x") == {
        "billing": "a, b: c",
        "technical": None,
    }
    assert parse_options('["a", "b"]', "x") == {"a": None, "b": None}


def test_bad_json_options_exit_2_naming_the_question(capsys: Any) -> None:
    assert main(["decide", "hi", "--choice", 'team={"billing": ']) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and "--choice team" in line and "JSON" in line


def test_choice_descriptions_reach_the_engine(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from clef_agents.fake import FakeEngine

    monkeypatch.setattr("clef_agents.cli.decide.build_engine", lambda args: FakeEngine())
    state = "please refund the money back"
    for spec, expected in [
        ("team=alpha:refund money back,beta:crash bug", "alpha"),
        ("team=alpha:crash bug,beta:refund money back", "beta"),
        ('team={"alpha": "crash, bug", "beta": "refund, money back"}', "beta"),
    ]:
        assert main(["decide", state, "--choice", spec]) == 0
        assert capsys.readouterr().out.startswith(f"team: {expected}")
    args = build_parser().parse_args(["decide", "x", "--score", 'u=["low, calm", "high"]'])
    assert collect_questions(args)["u"]["criteria"] == ["low, calm", "high"]

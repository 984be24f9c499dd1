"""``clef-agents batch``: bulk offline decisions over a CSV or Parquet file.

The output format follows ``--out``'s suffix: ``.parquet`` (or ``.pq``), ``.csv`` or
``.jsonl``. In JSONL, ``answers`` is a JSON object; in CSV and Parquet it is JSON text.

One output row per input row, in input order: ``row`` (the input row index), one column per
question (the choice, P(yes) or the expected score), ``answers`` (the full wire answers as
JSON) and ``error`` (the row's own error, or null). CSV cells are text: a number is read as
the text it is written as, and a cell that is not valid UTF-8 fails only its own row.

Work is written in chunks to ``OUT.parts/`` as it completes, so an interrupted run resumes
where it stopped; the final file is assembled at the end. ``OUT.parts/manifest.json`` ties
the chunks to the run that wrote them (a hash of the input file's content and of the
questions, the model version, ``--text-col``, ``--dtype`` and ``--int8``): a rerun that differs
in any of them refuses to mix the old answers in, and ``--restart`` discards them.
``--ray`` spreads the rows over a Ray cluster with Ray Data (one engine per actor).
"""

from __future__ import annotations

import argparse
import decimal
import hashlib
import json
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import (
    add_deprecated_alias,
    add_engine_args,
    add_threads_arg,
    apply_threads,
    build_engine,
    load_structured,
    number,
)
from clef_engine.errors import ClefError, InvalidRequestError, require
from clef_engine.protocol import Engine
from clef_engine.slots import Slots

MANIFEST = "manifest.json"
"""In ``OUT.parts/``: what the chunks there were computed from."""
MANIFEST_FORMAT = 1

EPILOG = """examples:
  clef-agents batch tickets.csv --questions q.json --out answers.parquet
  clef-agents batch tickets.parquet --questions q.yaml --text-col body --out out.parquet --ray
  clef-agents batch tickets.csv --questions q.json --out answers.jsonl      # or answers.csv
  clef-agents batch big.csv --questions q.json --out out.parquet   # rerun to resume
  clef-agents batch big.csv --questions q2.json --out out.parquet --restart  # start over
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "batch",
        help="answer questions for every row of a CSV/Parquet file",
        description="Bulk offline decisions: one output row per input row, resumable.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", help="input .csv or .parquet file")
    p.add_argument("--questions", required=True, metavar="FILE", help="JSON/YAML {id: question}")
    p.add_argument(
        "--out",
        required=True,
        metavar="OUT",
        help="output file; its suffix picks the format: .parquet (or .pq), .csv or .jsonl",
    )
    p.add_argument(
        "--text-col",
        action="append",
        default=None,
        metavar="COL",
        help="state column (default: 'state', 'text', or the only column); repeat to send "
        "several columns as one JSON object state",
    )
    add_deprecated_alias(p, "--column", "--text-col")
    p.add_argument(
        "--batch-size", type=number(int, low=1), default=64, metavar="N", help="rows per forward"
    )
    p.add_argument(
        "--chunk-rows",
        type=number(int, low=1),
        default=2048,
        metavar="N",
        help="rows per checkpointed chunk",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="discard the answers an earlier run left in OUT.parts/ and start again "
        "(without it, a rerun resumes, and refuses when its input, questions, model or "
        "options differ from the run that wrote them)",
    )
    p.add_argument("--ray", action="store_true", help="run on Ray Data")
    p.add_argument("--ray-address", default=None, metavar="ADDR", help="Ray cluster to join")
    p.add_argument(
        "--workers", type=number(int, low=1), default=1, metavar="N", help="Ray actors (engines)"
    )
    p.add_argument(
        "--num-gpus", type=number(float, low=0), default=0.0, metavar="G", help="GPUs per actor"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p)
    add_threads_arg(p)
    p.set_defaults(func=run)


# -- reading ------------------------------------------------------------------------------


def read_table(path: str, wanted: list[str] | None) -> tuple[Any, list[str], bool]:
    """The input's state columns as a pyarrow Table, their names, and whether they are raw
    CSV cells (bytes, decoded row by row by :func:`states_of`) rather than typed values.

    CSV state columns are read as bytes, not inferred: inference turns a column with one
    byte that is not UTF-8 into binary for every row (read as image bytes), and a column of
    numbers into integers (no state); a CSV cell is text.
    """
    require("pyarrow", package="pyarrow", extra="server", feature="clef-agents batch")
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    suffix = p.suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv", ".tsv"):
        raise UsageError(f"{path}: expected a .csv, .tsv or .parquet file")
    try:
        if suffix in (".parquet", ".pq"):
            cols = state_columns(pq.read_schema(p).names, wanted)
            return pq.read_table(p, columns=cols), cols, False
        opts = pcsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",")
        with pcsv.open_csv(p, parse_options=opts) as reader:  # the header, for the names
            names = reader.schema.names
        cols = state_columns(names, wanted)
        convert = pcsv.ConvertOptions(
            include_columns=cols, column_types=dict.fromkeys(cols, pa.binary())
        )
        return pcsv.read_csv(p, parse_options=opts, convert_options=convert), cols, True
    except UsageError:
        raise
    except Exception as exc:  # pyarrow raises its own error types
        raise UsageError(f"{path}: cannot read ({exc})") from None


def state_columns(names: list[str], wanted: list[str] | None) -> list[str]:
    names = list(names)
    if wanted:
        missing = [c for c in wanted if c not in names]
        if missing:
            raise UsageError(f"--text-col {missing[0]!r}: not in the input (columns: {names})")
        return list(dict.fromkeys(wanted))
    for default in ("state", "text"):
        if default in names:
            return [default]
    if len(names) == 1:
        return names
    raise UsageError(f"which column is the state? pass --text-col (columns: {names})")


def _cell(value: Any, column: str, raw: bool) -> Any:
    """One state value: a raw CSV cell decoded as UTF-8 (an :class:`InvalidRequestError`
    if it is not), a number from a typed column as its text."""
    if raw and isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequestError(
                f"column {column!r} is not valid UTF-8 text "
                f"(byte 0x{value[exc.start]:02x} at offset {exc.start})",
                field="state",
            ) from None
    if isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool):
        return str(value)
    return value


def _state(row: dict[str, Any], columns: list[str], raw: bool) -> Any:
    cells = {c: _cell(row[c], c, raw) for c in columns}
    return cells[columns[0]] if len(columns) == 1 else cells


def states_of(rows: list[dict[str, Any]], columns: list[str], raw: bool = False) -> Slots[Any]:
    """Each row's state (one column: its value; several: a JSON object); a row with a cell
    that cannot be read keeps its own :class:`InvalidRequestError` in its slot."""
    return Slots.parse(rows, lambda row: _state(row, columns, raw), catch=InvalidRequestError)


# -- answering ----------------------------------------------------------------------------


def answer_rows(
    engine: Engine, rows: list[int], states: Slots[Any], questions: Mapping[str, Any], batch: int
) -> list[dict[str, Any]]:
    """Answer the rows' states, ``batch`` at a time; one output record per row, each with
    its answers or its own error (a cell that could not be read, or the engine's)."""
    answers: list[Any] = []
    for start in range(0, len(states.pending), batch):
        chunk = states.pending[start : start + batch]
        payloads = [{"state": state, "questions": questions} for state in chunk]
        answers.extend(engine.decide_batch(payloads, return_exceptions=True))
    slots = states.fill(answers)
    return [record(row, slot, questions) for row, slot in zip(rows, slots, strict=True)]


def record(row: int, slot: Any, questions: Mapping[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {"row": int(row), "answers": None, "error": None}
    for qid in questions:
        rec[f"q.{qid}"] = None
    if isinstance(slot, BaseException):
        kind = getattr(slot, "error_type", type(slot).__name__)
        rec["error"] = f"{kind}: {slot}"
        return rec
    wire = slot.to_wire()
    rec["answers"] = json.dumps(wire["answers"], ensure_ascii=False)
    for qid, ans in wire["answers"].items():
        for key in ("choice", "noul", "score"):
            if key in ans:
                rec[f"q.{qid}"] = str(ans[key]) if key == "choice" else float(ans[key])
    return rec


def _schema(questions: Mapping[str, Any]) -> Any:
    import pyarrow as pa

    fields = [pa.field("row", pa.int64())]
    for qid, q in questions.items():
        kind = q.get("type") if isinstance(q, Mapping) else getattr(q, "type", None)
        fields.append(pa.field(f"q.{qid}", pa.string() if kind == "choice" else pa.float64()))
    fields += [pa.field("answers", pa.string()), pa.field("error", pa.string())]
    return pa.schema(fields)


# -- checkpoints --------------------------------------------------------------------------


def parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_manifest(
    args: argparse.Namespace, rows: int, cols: list[str], questions: Mapping[str, Any]
) -> dict[str, Any]:
    """What the answers of this run depend on (the model version is added once loaded)."""
    canonical = json.dumps(questions, sort_keys=True, ensure_ascii=False, default=str)
    return {
        "format": MANIFEST_FORMAT,
        "input_sha256": file_sha256(args.data),
        "input_rows": rows,
        "questions_sha256": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        "columns": cols,
        "dtype": getattr(args, "dtype", "auto"),
        "int8": bool(args.int8),
    }


_WHAT = {
    "format": "the checkpoint format",
    "input_sha256": "the input file's content",
    "input_rows": "the input's row count",
    "questions_sha256": "the questions",
    "model_version": "the model version",
    "columns": "the state columns (--text-col)",
    "dtype": "--dtype",
    "int8": "--int8",
}


def _differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    out = []
    for key, value in now.items():
        if saved.get(key) == value:
            continue
        what = _WHAT.get(key, key)
        if key in ("input_rows", "model_version", "columns", "dtype", "int8"):
            what += f" ({saved.get(key)} then, {value} now)"
        out.append(what)
    return out


def check_parts(parts: Path, expected: Mapping[str, Any], restart: bool) -> None:
    """Refuse to resume from chunks another run wrote (``expected``: this run's manifest,
    possibly without the model version yet). With ``restart`` nothing is refused."""
    if restart or not parts.exists():
        return
    remedy = f"rerun with --restart to discard them and start again, or delete {parts}"
    if not parts.is_dir():
        raise UsageError(f"{parts} is in the way of the checkpoint dir: delete it")
    chunks = sorted(parts.glob("*.parquet"))
    try:
        saved = json.loads((parts / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict):
        if chunks:
            raise UsageError(
                f"{parts} holds {len(chunks)} chunk(s) of answers from an earlier run with "
                f"no readable {MANIFEST}, so they cannot be checked against this run; {remedy}"
            )
        return
    differs = _differences(saved, expected)
    if differs and chunks:
        raise UsageError(
            f"{parts} holds answers of a different run; changed since: {', '.join(differs)}; "
            f"{remedy}"
        )


def open_parts(parts: Path, manifest: Mapping[str, Any], restart: bool) -> None:
    """Make ``parts`` ready for this run: check it (see :func:`check_parts`), empty it when
    restarting or when it holds no chunks, and record this run's manifest."""
    check_parts(parts, manifest, restart)
    if parts.is_dir() and (restart or not any(parts.glob("*.parquet"))):
        old = len(list(parts.glob("*.parquet")))
        if restart and old:
            sys.stderr.write(f"--restart: discarding {old} chunk(s) of answers in {parts}\n")
        shutil.rmtree(parts)
    elif parts.exists() and not parts.is_dir():
        parts.unlink()
    parts.mkdir(parents=True, exist_ok=True)
    path = parts / MANIFEST
    if not path.exists():
        tmp = parts / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(dict(manifest), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)


def done_rows(parts: Path, n_rows: int | None = None) -> set[int]:
    """Rows already answered by an earlier (interrupted) run; unreadable parts are dropped.

    Raises:
        UsageError: A chunk holds a row past the input's ``n_rows`` (stale answers).
    """
    import pyarrow.parquet as pq

    done: set[int] = set()
    if not parts.is_dir():
        return done
    for f in sorted(parts.glob("*.parquet")):
        try:
            done.update(int(r) for r in pq.read_table(f, columns=["row"])["row"].to_pylist())
        except Exception:  # a part cut short by the interruption: redo its rows
            f.unlink()
    if n_rows is not None and done and max(done) >= n_rows:
        raise UsageError(
            f"{parts} holds answers for row {max(done)}, but the input has {n_rows} rows: "
            f"they are from another input; rerun with --restart to discard them and start "
            f"again, or delete {parts}"
        )
    return done


def write_part(parts: Path, records: list[dict[str, Any]], schema: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not records:
        return
    first, last = records[0]["row"], records[-1]["row"]
    tmp = parts / f".part-{first:012d}-{last:012d}.tmp"
    pq.write_table(pa.Table.from_pylist(records, schema=schema), tmp)
    tmp.rename(parts / f"part-{first:012d}-{last:012d}.parquet")  # atomic: never half a part


def assemble(parts: Path, out: Path, n_rows: int, schema: Any) -> tuple[int, int]:
    """Write the chunks' rows, in order, to ``out`` in its format; (rows, rows failed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f).cast(schema) for f in sorted(parts.glob("*.parquet"))]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    table = table.sort_by("row")
    rows = table["row"].to_pylist()
    if rows != list(range(n_rows)):
        raise ClefError(
            f"{out}: the chunks in {parts} hold {len(rows)} rows for {n_rows} input rows; "
            f"rerun with --restart to discard them and start again, or delete {parts}"
        )
    failed = table.num_rows - table["error"].null_count  # the rows with an error
    tmp = out.with_name(out.name + ".tmp")
    write_output(table, tmp, output_format(out))
    tmp.replace(out)
    shutil.rmtree(parts)
    return len(rows), failed


OUTPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl"}
"""``--out`` suffix -> the format written."""


def output_format(out: Path) -> str:
    """The format ``--out``'s suffix asks for.

    Raises:
        UsageError: An unknown suffix, naming the ones accepted.
    """
    kind = OUTPUT_FORMATS.get(out.suffix.lower())
    if kind is None:
        raise UsageError(
            f"--out {out}: unknown output format {out.suffix or '(no suffix)'!r}; "
            "name a .parquet, .pq, .csv or .jsonl file"
        )
    return kind


def write_output(table: Any, path: Path, kind: str) -> None:
    """Write the assembled answers as Parquet, CSV (with a header) or JSON lines."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif kind == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, path)
    else:
        with path.open("w", encoding="utf-8") as f:
            for batch in table.to_batches(max_chunksize=4096):
                for row in batch.to_pylist():
                    if row["answers"] is not None:
                        row["answers"] = json.loads(row["answers"])
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")


# -- runners ------------------------------------------------------------------------------


def _chunks(todo: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(todo), size):
        yield todo[start : start + size]


def run_local(
    args: argparse.Namespace,
    engine: Engine,
    table: Any,
    cols: list[str],
    questions: Any,
    raw: bool,
) -> None:
    from tqdm import tqdm

    parts = parts_dir(Path(args.out))
    done = done_rows(parts, table.num_rows)
    todo = [i for i in range(table.num_rows) if i not in done]
    schema = _schema(questions)
    bar = tqdm(total=table.num_rows, initial=len(done), unit="row", disable=args.no_progress)
    for chunk in _chunks(todo, args.chunk_rows):
        rows = table.take(chunk).select(cols).to_pylist()
        states = states_of(rows, cols, raw)
        records = answer_rows(engine, chunk, states, questions, args.batch_size)
        write_part(parts, records, schema)
        bar.update(len(chunk))
    bar.close()


class _RayAnswerer:
    """A Ray Data actor: one engine, answers batches of rows."""

    def __init__(
        self,
        model: str | None,
        device: str,
        int8: bool,
        questions: dict[str, Any],
        cols: list[str],
        batch_size: int,
        raw: bool = False,
        dtype: str = "auto",
    ) -> None:
        ns = argparse.Namespace(model=model, device=device, int8=int8, dtype=dtype)
        self.engine = build_engine(ns)
        self.questions = questions
        self.cols = cols
        self.batch_size = batch_size
        self.raw = raw

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = batch.to_pylist()
        records = answer_rows(
            self.engine,
            [r["row"] for r in rows],
            states_of(rows, self.cols, self.raw),
            self.questions,
            self.batch_size,
        )
        return pa.Table.from_pylist(records, schema=_schema(self.questions))


def run_ray(
    args: argparse.Namespace, table: Any, cols: list[str], questions: Any, raw: bool
) -> None:
    require("ray.data", package="ray[data]", extra="ray", feature="clef-agents batch --ray")
    import pyarrow as pa
    import pyarrow.compute as pc
    import ray

    parts = parts_dir(Path(args.out))
    done = done_rows(parts, table.num_rows)
    indexed = table.select(cols).append_column("row", pa.array(range(table.num_rows), pa.int64()))
    if done:
        mask = pc.invert(pc.is_in(indexed["row"], value_set=pa.array(sorted(done), pa.int64())))
        indexed = indexed.filter(mask)
    if indexed.num_rows == 0:
        return
    if not ray.is_initialized():
        ray.init(address=args.ray_address, include_dashboard=False)
    ds = ray.data.from_arrow(indexed).repartition(max(1, indexed.num_rows // args.chunk_rows))
    answered = ds.map_batches(
        _RayAnswerer,
        fn_constructor_kwargs={
            "model": args.model,
            "device": args.device,
            "int8": args.int8,
            "questions": dict(questions),
            "cols": cols,
            "batch_size": args.batch_size,
            "raw": raw,
            "dtype": getattr(args, "dtype", "auto"),
        },
        batch_size=args.chunk_rows,
        batch_format="pyarrow",
        concurrency=args.workers,
        num_gpus=args.num_gpus or None,
    )
    schema = _schema(questions)
    for block in answered.iter_batches(batch_size=args.chunk_rows, batch_format="pyarrow"):
        write_part(parts, block.to_pylist(), schema)  # type: ignore[union-attr]


def run(args: argparse.Namespace) -> int:
    loaded = load_structured(args.questions)
    if isinstance(loaded, Mapping) and "questions" in loaded:
        loaded = loaded["questions"]
    if not isinstance(loaded, Mapping) or not loaded:
        raise UsageError(f"{args.questions}: expected a mapping of question id to question")
    from clef_engine.schema.request import questions_from

    questions_from(loaded)  # validate once, up front (InvalidRequestError → exit 2)
    questions = dict(loaded)
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {args.out}: is a directory; name a .parquet, .csv or .jsonl file")
    output_format(out)  # an unknown suffix fails before any work
    table, cols, raw = read_table(args.data, args.text_col)
    parts = parts_dir(out)
    manifest = run_manifest(args, table.num_rows, cols, questions)
    check_parts(parts, manifest, args.restart)  # before minutes of model loading
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot create its directory ({exc})") from None
    apply_threads(args)
    # The model version ties the chunks to the weights (on Ray too, where the actors load
    # their own engines: the driver loads it once to know the version).
    engine = build_engine(args)
    manifest["model_version"] = engine.model_version
    open_parts(parts, manifest, args.restart)
    if args.ray:
        del engine
        run_ray(args, table, cols, questions, raw)
    else:
        run_local(args, engine, table, cols, questions, raw)
    n, n_failed = assemble(parts, out, table.num_rows, _schema(questions))
    note = f" ({n_failed} failed: see the error column)" if n_failed else ""
    sys.stderr.write(f"wrote {n} rows to {out}{note}\n")
    return 0

"""``clef-agents batch``: bulk offline decisions over a CSV or Parquet file.

One output row per input row, in input order: ``row`` (the input row index), one column per
question (the choice, P(yes) or the expected score), ``answers`` (the full wire answers as
JSON) and ``error`` (the row's own error, or null). Work is written in chunks to
``OUT.parts/`` as it completes, so an interrupted run resumes where it stopped; the final
file is assembled at the end. ``--ray`` spreads the rows over a Ray cluster with Ray Data
(one engine per actor).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import add_engine_args, build_engine, load_structured
from engine.errors import ClefError, require

EPILOG = """examples:
  clef-agents batch tickets.csv --questions q.json --out answers.parquet
  clef-agents batch tickets.parquet --questions q.yaml --column body --out out.parquet --ray
  clef-agents batch big.csv --questions q.json --out out.parquet   # rerun to resume
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
    p.add_argument("--out", required=True, metavar="OUT.parquet", help="output Parquet file")
    p.add_argument(
        "--column",
        action="append",
        default=None,
        metavar="NAME",
        help="state column (default: 'state', 'text', or the only column); repeat to send "
        "several columns as one JSON object state",
    )
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="rows per forward")
    p.add_argument(
        "--chunk-rows", type=int, default=2048, metavar="N", help="rows per checkpointed chunk"
    )
    p.add_argument("--ray", action="store_true", help="run on Ray Data")
    p.add_argument("--ray-address", default=None, metavar="ADDR", help="Ray cluster to join")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="Ray actors (engines)")
    p.add_argument("--num-gpus", type=float, default=0.0, metavar="G", help="GPUs per actor")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p)
    p.set_defaults(func=run)


# -- reading ------------------------------------------------------------------------------


def read_table(path: str) -> Any:
    """The whole input as a pyarrow Table (CSV or Parquet)."""
    require("pyarrow", package="pyarrow", extra="server", feature="clef-agents batch")
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            return pq.read_table(p)
        if p.suffix.lower() in (".csv", ".tsv"):
            opts = pcsv.ParseOptions(delimiter="\t" if p.suffix.lower() == ".tsv" else ",")
            return pcsv.read_csv(p, parse_options=opts)
    except Exception as exc:  # pyarrow raises its own error types
        raise UsageError(f"{path}: cannot read ({exc})") from None
    raise UsageError(f"{path}: expected a .csv, .tsv or .parquet file")


def state_columns(table: Any, wanted: list[str] | None) -> list[str]:
    names = list(table.column_names)
    if wanted:
        missing = [c for c in wanted if c not in names]
        if missing:
            raise UsageError(f"--column {missing[0]!r}: not in the input (columns: {names})")
        return wanted
    for default in ("state", "text"):
        if default in names:
            return [default]
    if len(names) == 1:
        return names
    raise UsageError(f"which column is the state? pass --column (columns: {names})")


def states_of(rows: list[dict[str, Any]], columns: list[str]) -> list[Any]:
    if len(columns) == 1:
        return [row[columns[0]] for row in rows]
    return [{c: row[c] for c in columns} for row in rows]


# -- answering ----------------------------------------------------------------------------


def answer_rows(
    engine: Any, rows: list[int], states: list[Any], questions: Mapping[str, Any], batch: int
) -> list[dict[str, Any]]:
    """Answer ``states``; one output record per row, errors kept per row."""
    out: list[dict[str, Any]] = []
    for start in range(0, len(states), batch):
        chunk = states[start : start + batch]
        payloads = [{"state": s, "questions": questions} for s in chunk]
        slots = engine.decide_batch(payloads, return_exceptions=True)
        for row, slot in zip(rows[start : start + batch], slots, strict=True):
            out.append(record(row, slot, questions))
    return out


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


def done_rows(parts: Path) -> set[int]:
    """Rows already answered by an earlier (interrupted) run; unreadable parts are dropped."""
    import pyarrow.parquet as pq

    done: set[int] = set()
    if not parts.is_dir():
        return done
    for f in sorted(parts.glob("*.parquet")):
        try:
            done.update(int(r) for r in pq.read_table(f, columns=["row"])["row"].to_pylist())
        except Exception:  # a part cut short by the interruption: redo its rows
            f.unlink()
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


def assemble(parts: Path, out: Path, n_rows: int, schema: Any) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f).cast(schema) for f in sorted(parts.glob("*.parquet"))]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    table = table.sort_by("row")
    rows = table["row"].to_pylist()
    if rows != list(range(n_rows)):
        raise ClefError(f"{out}: assembled {len(rows)} rows for {n_rows} input rows")
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    shutil.rmtree(parts)
    return len(rows)


# -- runners ------------------------------------------------------------------------------


def _chunks(todo: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(todo), size):
        yield todo[start : start + size]


def run_local(args: argparse.Namespace, table: Any, cols: list[str], questions: Any) -> None:
    from tqdm import tqdm

    parts = parts_dir(Path(args.out))
    parts.mkdir(parents=True, exist_ok=True)
    done = done_rows(parts)
    todo = [i for i in range(table.num_rows) if i not in done]
    schema = _schema(questions)
    engine = build_engine(args)
    bar = tqdm(total=table.num_rows, initial=len(done), unit="row", disable=args.no_progress)
    for chunk in _chunks(todo, args.chunk_rows):
        rows = table.take(chunk).select(cols).to_pylist()
        records = answer_rows(engine, chunk, states_of(rows, cols), questions, args.batch_size)
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
    ) -> None:
        ns = argparse.Namespace(model=model, device=device, int8=int8)
        self.engine = build_engine(ns)
        self.questions = questions
        self.cols = cols
        self.batch_size = batch_size

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = batch.to_pylist()
        records = answer_rows(
            self.engine,
            [r["row"] for r in rows],
            states_of(rows, self.cols),
            self.questions,
            self.batch_size,
        )
        return pa.Table.from_pylist(records, schema=_schema(self.questions))


def run_ray(args: argparse.Namespace, table: Any, cols: list[str], questions: Any) -> None:
    require("ray.data", package="ray[data]", extra="ray", feature="clef-agents batch --ray")
    import pyarrow as pa
    import pyarrow.compute as pc
    import ray

    parts = parts_dir(Path(args.out))
    parts.mkdir(parents=True, exist_ok=True)
    done = done_rows(parts)
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
    if args.batch_size < 1 or args.chunk_rows < 1:
        raise UsageError("--batch-size and --chunk-rows must be >= 1")
    loaded = load_structured(args.questions)
    if isinstance(loaded, Mapping) and "questions" in loaded:
        loaded = loaded["questions"]
    if not isinstance(loaded, Mapping) or not loaded:
        raise UsageError(f"{args.questions}: expected a mapping of question id to question")
    from engine.schema.request import questions_from

    questions_from(loaded)  # validate once, up front (InvalidRequestError → exit 2)
    questions = dict(loaded)
    table = read_table(args.data)
    cols = state_columns(table, args.column)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.ray:
        run_ray(args, table, cols, questions)
    else:
        run_local(args, table, cols, questions)
    n = assemble(parts_dir(out), out, table.num_rows, _schema(questions))
    import sys

    sys.stderr.write(f"wrote {n} rows to {out}\n")
    return 0

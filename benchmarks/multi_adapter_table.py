"""The tables of benchmarks/multi_adapter.sh: ``add`` turns one run's output into a record of
OUT/runs.jsonl (steady-state tokens/s from ``wgrumus train --json``'s "steady" field, or from
torch_reference.py's); ``table`` prints a part's rows with their ratios against the row each
names as reference (the same model on one adapter at the same global batch) and the target.

    python benchmarks/multi_adapter_table.py add OUT PART MODEL ROW ADAPTERS REF TARGET RC FILE
    python benchmarks/multi_adapter_table.py table OUT [PART ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def add(out, part, model, row, adapters, ref, target, rc, file) -> None:
    rec = {"part": part, "model": model, "row": row, "adapters": int(adapters), "ref": ref,
           "target": float(target) if target not in ("", "-") else None, "rc": int(rc),
           "tokens_per_s": None, "step_ms": None, "steady": False, "final_loss": None}
    got = _last_json(Path(file).read_text(errors="replace")) if int(rc) == 0 else None
    if got is not None:
        steady = got.get("steady")
        if isinstance(steady, dict) and steady.get("tokens_per_s"):
            rec.update(tokens_per_s=steady["tokens_per_s"], step_ms=steady.get("step_ms"),
                       steady=True)
        elif got.get("throughput"):  # a wgrumus without the "steady" field: the whole run
            rec["tokens_per_s"] = got["throughput"]
        rec["final_loss"] = got.get("final_loss")
    with open(Path(out) / "runs.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _records(out) -> list[dict]:
    path = Path(out) / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(out, parts) -> None:
    recs = _records(out)
    parts = parts or list(dict.fromkeys(r["part"] for r in recs))
    for part in parts:
        rows = [r for r in recs if r["part"] == part]
        if not rows:
            continue
        print(f"\n== {part}: steady tokens/s, ratio vs the reference row (same run) ==")
        print(f"{'model':<7} {'row':<22} {'GPUs':>4} {'tokens/s':>11} {'ms/step':>8} "
              f"{'ratio':>6} {'target':>7} {'loss':>7}  note")
        for r in rows:
            base = next((b for b in rows if b["model"] == r["model"] and b["row"] == r["ref"]),
                        None)
            tps = r["tokens_per_s"]
            ratio = tps / base["tokens_per_s"] if base and tps and base["tokens_per_s"] else None
            note = "" if r["rc"] == 0 else f"failed (exit {r['rc']}, see {part}.log)"
            if r["rc"] == 0 and not r["steady"] and tps:
                note = "whole run (no 'steady' field)"
            if ratio is not None and r["target"] is not None:
                note = ("meets" if ratio >= r["target"] else "BELOW") + " target" + \
                    (f"; {note}" if note else "")
            if part == "loss" and base and r["final_loss"] and base["final_loss"] and \
                    r is not base:  # the final loss against the reference row's (within 2%?)
                dev = r["final_loss"] / base["final_loss"] - 1
                note = f"loss {100 * dev:+.2f}% vs {r['ref']}" + (f"; {note}" if note else "")
            print(f"{r['model']:<7} {r['row']:<22} {r['adapters']:>4} "
                  f"{_num(tps, '{:,.0f}'):>11} {_num(r['step_ms'], '{:.2f}'):>8} "
                  f"{_num(ratio, '{:.2f}x'):>6} {_num(r['target'], '>={:.2f}'):>7} "
                  f"{_num(r['final_loss'], '{:.4f}'):>7}  {note}")


def _num(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "add":
        add(*args)
    elif cmd == "table":
        table(args[0], args[1:])
    else:
        sys.exit(f"unknown command {cmd!r}; use add or table")

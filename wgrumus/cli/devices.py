"""`wgrumus devices`: which adapters exist, which logical devices this process would use."""
from __future__ import annotations

import os

from ..runtime import adapters as adapter_list
from ..runtime.context import MultiGpuContext
from ..runtime.device import OPTIONAL_FEATURES as FEATURES
from .common import console, print_json


def add_parser(sub) -> None:
    p = sub.add_parser("devices", help="list WebGPU adapters and the devices wgrumus would use",
                       description="List WebGPU adapters and the devices wgrumus would use. "
                       "WGRUMUS_ADAPTER (index, name substring or backend, comma-separated) "
                       "picks adapters; WGRUMUS_DEVICES=N makes N devices (several logical "
                       "devices per adapter when N is larger than the adapters present).")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=run)


def _size(n) -> str:
    from rich.filesize import decimal  # rich loads only for the tables (not for --json)
    return decimal(n) if n else "?"


def adapter_rows(adapters) -> list[dict]:
    rows = []
    for i, a in enumerate(adapters):
        info, lim = a.info, a.limits
        rows.append({
            "index": i, "name": info.get("device") or "?", "backend": info.get("backend_type"),
            "type": info.get("adapter_type"), "vendor": info.get("vendor"),
            "driver": info.get("description"),
            "max_buffer_size": int(lim.get("max-buffer-size", 0)),
            "max_storage_binding": int(lim.get("max-storage-buffer-binding-size", 0)),
            "features": [f for f in FEATURES if f in a.features]})
    return rows


def run(args) -> int:
    all_adapters = adapter_list.enumerate_adapters()
    adapters = adapter_rows(all_adapters)
    chosen = adapter_list.select_adapters() if all_adapters else adapter_list.Selection()
    devs = MultiGpuContext.get().devices if all_adapters else []
    dev_rows = [{"index": d.index, "name": d.name, "adapter": d.adapter_index,
                 "logical": d.logical,
                 "features": sorted(f for f in FEATURES if f in d.features),
                 "max_binding": d.max_binding, "default": d.index == 0} for d in devs]
    env = {k: os.environ.get(k) for k in ("WGRUMUS_ADAPTER", "WGRUMUS_DEVICES")}
    if args.json:
        print_json({"adapters": adapters, "selected_adapters": chosen.indices,
                    "devices": dev_rows, "default_device": 0, "env": env})
        return 0

    from rich.table import Table  # rich loads only for the tables (not for --json)
    con = console()
    t = Table(title="WebGPU adapters", title_justify="left")
    for col in ("#", "name", "backend", "type", "max buffer / binding", "features"):
        t.add_column(col)
    sel = set(chosen.indices)
    for r in adapters:
        mark = "*" if r["index"] in sel else " "
        t.add_row(f"{r['index']}{mark}", r["name"], r["backend"] or "?", r["type"] or "?",
                  f"{_size(r['max_buffer_size'])} / {_size(r['max_storage_binding'])}",
                  ", ".join(r["features"]) or "-")
    con.print(t)
    t = Table(title="wgrumus devices of this process", title_justify="left")
    for col in ("device", "name", "adapter #", "default"):
        t.add_column(col)
    for r in dev_rows:
        t.add_row(str(r["index"]), r["name"], str(r["adapter"]), "yes" if r["default"] else "")
    con.print(t)
    con.print(f"* = selected adapter.  WGRUMUS_ADAPTER={env['WGRUMUS_ADAPTER'] or '(unset: all)'}"
              f"  WGRUMUS_DEVICES={env['WGRUMUS_DEVICES'] or '(unset: one per adapter)'}")
    con.print("Select adapters with WGRUMUS_ADAPTER=<index|name substring|backend>[,...]; make N "
              "devices with WGRUMUS_DEVICES=N (logical devices share an adapter round-robin).")
    return 0

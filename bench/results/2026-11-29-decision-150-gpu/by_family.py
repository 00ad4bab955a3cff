"""The folder run's turns by the turn set's family and kind (no device needed):

    python3 by_family.py RUN_DIR TURN_FOLDER    # e.g. one_gpu_h150_folder/mps-prio /tmp/turnset

Each caller's turns (the conversations JSON's per_turn, interruptions left out) are its
dialog's turns in order; each names the folder's turn it spoke (`ref`).
"""
import collections
import json
import sys
from pathlib import Path

run, folder = Path(sys.argv[1]), Path(sys.argv[2])
meta = {f.stem: json.loads(f.read_text()) for f in folder.glob("*.json")}
for n in (1, 16, 64):
    if not (run / f"conv_{n}.json").is_file():
        continue  # a level not run
    c = json.loads((run / f"conv_{n}.json").read_text())
    dialogs = {d["caller"]: d for d in c["dialogs"]}
    rows = collections.defaultdict(list)
    for t in c["levels"][0]["per_turn"]:
        if t["kind"] != "interrupt":
            rows[t["caller"]].append(t)
    fam = collections.defaultdict(collections.Counter)
    kind = collections.defaultdict(collections.Counter)
    for caller, ts in rows.items():
        # a caller that ended early spoke only its first turns
        for t, script in zip(sorted(ts, key=lambda t: t["turn"]), dialogs[caller]["turns"],
                             strict=False):
            assert t["kind"] == script["kind"], (t, script)
            m = meta[script["ref"]]
            for k in (fam[m["family"]], kind[f"{m['family']}/{m['kind']}"]):
                if t["kind"] == "paused":
                    k["paused"] += 1
                    k["cut"] += bool(t["false_cutoff"])
                else:
                    k["plain"] += 1
                    k["plain_over_1s"] += (t["eot_to_first_audio_ms"] or 0) > 1000
    print(n, {f: dict(v) for f, v in sorted(fam.items())})
    for k, v in sorted(kind.items()):
        if v["paused"]:
            print("   ", k, f"cut {v['cut']}/{v['paused']}")

"""The on-disk format of native checkpoints (private): writing it atomically, reading it back.

Layout of a checkpoint directory: `manifest.json` (format, and per table: name, spec, counters,
insertion / update sequence counters, generator state, file names) and per table
`table_<i>.npz` (items in canonical order: slots, keys, priorities, times_sampled, insertion
and update order, free slots, data leaves) plus `table_<i>.pkl` (the items' objects) for tables
without a signature. What goes into a table's entry is the table's (`Table._snapshot`); this
module only stores and loads it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

FORMAT = "trellis-reverb-tables/1"
MANIFEST = "manifest.json"

# One table's snapshot: (json meta, arrays, objects or None).
Snapshot = tuple[dict[str, Any], dict[str, np.ndarray], list[Any] | None]


def write(directory: str, snapshots: Sequence[tuple[str, Snapshot]]) -> None:
    """Writes (name, snapshot) pairs as the checkpoint `directory` (an absolute path).

    Files go to a temporary sibling directory that then replaces `directory`, so a reader finds
    either the old checkpoint or the new one, never a mix.
    """
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        manifest: dict[str, Any] = {"format": FORMAT, "tables": []}
        for i, (name, (meta, arrays, objects)) in enumerate(snapshots):
            entry = {"name": name, "file": f"table_{i:03d}.npz", **meta}
            with open(os.path.join(tmp, entry["file"]), "wb") as f:
                # allow_pickle named (its default), so that no array can be taken for it.
                np.savez(f, allow_pickle=True, **arrays)
            if objects is not None:
                entry["objects"] = f"table_{i:03d}.pkl"
                with open(os.path.join(tmp, entry["objects"]), "wb") as f:
                    pickle.dump(objects, f, protocol=pickle.HIGHEST_PROTOCOL)
            manifest["tables"].append(entry)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        old = None
        if os.path.exists(directory):
            old = f"{directory}.old-{uuid.uuid4().hex[:8]}"
            os.rename(directory, old)
        os.rename(tmp, directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read(directory: str, names: Sequence[str]) -> dict[str, Snapshot]:
    """Reads the checkpoint in `directory`, which must hold exactly the tables `names`.

    Returns:
        {name: snapshot}; each snapshot's meta is the table's manifest entry.

    Raises:
        FileNotFoundError: no checkpoint in `directory`.
        ValueError: another format, or other tables.
    """
    with open(os.path.join(directory, MANIFEST)) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{directory} holds format {manifest.get('format')!r}, expected "
                         f"{FORMAT!r}")
    saved = {e["name"]: e for e in manifest["tables"]}
    if sorted(saved) != sorted(names):
        raise ValueError(f"checkpoint holds tables {sorted(saved)}, this client serves "
                         f"{sorted(names)}")
    loaded = {}
    for name, entry in saved.items():
        with np.load(os.path.join(directory, entry["file"]), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        objects = None
        if "objects" in entry:
            with open(os.path.join(directory, entry["objects"]), "rb") as f:
                objects = pickle.load(f)
        loaded[name] = (entry, arrays, objects)
    return loaded

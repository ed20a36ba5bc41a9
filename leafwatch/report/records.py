"""What leafwatch writes to TensorBoard: every tag name and the versioned record format.

The one place both sides agree on, torch-free (as TensorBoard's own ``plugins/text/metadata.py``
is shared by its summary writer and its plugin): the sink
(:mod:`leafwatch.sinks.tensorboard`) and the Lightning metrics sink write these tags, the
Leafwatch tab (:mod:`leafwatch.tensorboard_plugin`) and ``leafwatch report``
(:mod:`leafwatch.report.reader`) read them back. The tags, all under the ``leafwatch/`` prefix,
are the constants below (when each is written: :mod:`leafwatch.sinks.tensorboard`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

#: The TensorBoard plugin name of leafwatch's records (and of the Leafwatch tab).
PLUGIN_NAME = "leafwatch"
#: ``SummaryMetadata.plugin_data.content`` of every record.
PLUGIN_CONTENT = b"1"
#: The version of the records written now; a reader skips records of a newer version.
#: 2: a report's findings are mistakes, each listing its tensors in ``members`` (version 1
#: listed one finding per tensor; readers group those as they read them).
#: 3: each finding carries its ``reason``, its ``args`` (what its words were rendered from) and its
#: ``remedy`` (the fix as data: code or words, and where the code goes in the user's file).
RECORD_VERSION = 3

#: The latest report of a run (JSON): what the tab's findings table and ``leafwatch report`` read.
REPORT_TAG = "leafwatch/report"
#: Prefix of the coverage records, one tag per chunk of steps (:func:`coverage_tag`).
COVERAGE_PREFIX = "leafwatch/coverage/"
#: The markdown findings table, for TensorBoard's Text tab.
FINDINGS_TEXT_TAG = "leafwatch/findings"
#: Prefix of the scalars of open findings per kind (:func:`open_tag`).
OPEN_PREFIX = "leafwatch/open/"
#: The scalar share of the checked trainable tensors that got a gradient.
GRAD_COVERAGE_TAG = "leafwatch/grad_coverage"
#: The sub-run (folder under the log directory) holding the custom-scalars layout, so that the
#: user's own layout is never replaced.
LAYOUT_RUN = "leafwatch-layout"
#: The outcome of ``--verify`` (:mod:`leafwatch.report.verify`): written by the verify command, never
#: by a run, beside the verified run's records (in a file of its own) and beside its rerun's.
VERIFY_TAG = "leafwatch/verify"
#: The end of the name of the event file that holds a verification record.
VERIFY_SUFFIX = ".leafwatch-verify"

#: The records, each one document in a string tensor.
RECORD_FORMAT = """
leafwatch/report          latest wins; written when the findings change and at close (UTF-8 JSON):
    {"version": 3, "step": int, "counts": {kind: open mistakes}, "findings": [Finding.to_dict(), ...]}
    one finding per mistake; its "members" are the per-tensor findings (Finding.to_dict() each,
    with "members": []). Version 1 wrote per-tensor findings only (no "members").
    Each finding: "message", "cause", "fix" (its words, rendered once), "reason", "args" (what
    they were rendered from: plain data), "remedy": {"applicability": "code" | "words", "code":
    the snippet, "edit": null or {"path": absolute path of the user's file, "start", "end": its
    lines, "action": "insert_after" | "replace", "text": the lines to write}} (null without a
    fix). Versions 1 and 2 carried no "reason", "args" or "remedy": read with the reason of
    "details" and no remedy.
    "patch": {"root": the folder the run was started in, "files": {absolute path: sha256 of the
    file as the run read it}, "hunks": [{"kind", "name", "diff": the finding's own unified diff}]}:
    what `leafwatch report --diff` and the tab's hunks need (leafwatch/report/patch.py); absent
    in records written before it (their patch is refused: run again).
    "nothing_to_check": true is added when no tensor required grad and nothing was watched
    (absent otherwise, and in records written before it: read as false).
    "command": what `leafwatch run` ran, so that `--verify` can run it again (absent from the records
    of a Monitor, a callback, and of records written before it):
        {"by": "leafwatch run", "python": the interpreter it ran in, "cwd": the working folder it
         started in, "script": the path as given (null with -m), "module": null or the -m module,
         "args": [the script's arguments],
         "options": {"logdir": as given, "strict": bool, "patience": int, "ignore": {pattern:
         reason}, "max_steps": null or int}, "started": its wall time when it started,
         "ended": null while it runs, then {"exit_code": the script's own (null when leafwatch
         stopped it), "stopped_by": null | "--strict" | "--max-steps" (leafwatch stopped the
         script: it did not crash), "step": the optimizer steps it made}}
leafwatch/verify          the outcome of `--verify`, written once by the verify command into the
    verified run's folder and into its rerun's (an event file of its own, "*.leafwatch-verify"):
    {"version": 3, "step": the optimizer steps the verified run made, "steps": those the rerun
     made, "limit": --verify-steps, "rerun": {"folder": the scratch copy, "logdir", "command":
     [argv], "exit_code", "stopped": bool, "log": the file holding its output},
     "hunks": [{"kind", "name", "diff": the hunk as the run recorded it, "outcome": "fixed" |
        "still_open" | "undecided", "decided_step": when the verified run decided it}],
     "left_out": [{"kind", "name", "outcome"}]: the open findings the patch does not fix,
     "new": [{"kind", "name", "severity", "message"}]: open in the rerun, not in the run,
     "problems": [one line each: what else failed (the rerun crashed, wrote to a linked file)],
     "exit_code": 0 | 1}
leafwatch/coverage/NNNNNN one tag per chunk of `chunk_steps` steps (so TensorBoard's per-tag
    sampling never drops history); the latest sample of a tag is the whole chunk so far,
    zlib-compressed JSON (rewritten a few times per chunk and when the findings change):
    {"version": 3, "chunk": int, "groups": {group: {
        "names": [qualified names of the tensors checked when this group steps],
        "steps": [[first, last], ...]   # ranges of the steps this group was checked at, in order
        "missed": {name_index: [[i, j], ...]}   # ranges of positions in that list of checks
    }}}
    A group is the index of the optimizer that stepped ("all" when none was given).
    "in_no_optimizer": [{"names": [qualified names of the tensors that require grad and that no
        optimizer holds: nothing updates them], "steps": [[first, last], ...] (the checks while
        that was so)}, ...]: one entry per set of such tensors, in order (a late optimizer can take
        some); absent when every such tensor is in an optimizer, when no optimizer was given, and in
        records written before it (read as none).
"""


def open_tag(kind: str) -> str:
    """The scalar tag of the open findings of one kind: ``leafwatch/open/<kind>``."""
    return f"{OPEN_PREFIX}{kind}"


def coverage_tag(chunk: int) -> str:
    """The tag of the coverage record of one chunk: ``leafwatch/coverage/000003``."""
    return f"{COVERAGE_PREFIX}{chunk:06d}"


def is_coverage_tag(tag: str) -> bool:
    return tag.startswith(COVERAGE_PREFIX)


def layout() -> dict[str, Any]:
    """The custom-scalars layout: one chart of the open findings per kind, one of the coverage."""
    return {PLUGIN_NAME: {"open findings per kind": ["Multiline", [rf"{OPEN_PREFIX}.*"]],
                          "grad coverage": ["Multiline", [GRAD_COVERAGE_TAG]]}}


def encode_report(report: Mapping[str, Any], patch: Mapping[str, Any] | None = None,
                  command: Mapping[str, Any] | None = None) -> str:
    """The ``leafwatch/report`` record of a report's ``to_dict()``: JSON with the version, what its
    patch needs (:func:`leafwatch.report.patch.record`) and what ``leafwatch run`` ran (``command``), each
    when given."""
    return json.dumps({"version": RECORD_VERSION, **report, **({"patch": dict(patch)} if patch is not None else {}),
                       **({"command": dict(command)} if command is not None else {})})


def tensor_summary(tag: str, payload: str | bytes) -> Any:
    """A ``Summary`` proto holding one string (UTF-8 JSON, or zlib-compressed JSON), tagged for
    the Leafwatch plugin (TensorBoard's protos, imported here: no torch)."""
    from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    plugin = summary_pb2.SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=PLUGIN_CONTENT)
    metadata = summary_pb2.SummaryMetadata(plugin_data=plugin, data_class=summary_pb2.DATA_CLASS_TENSOR)
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                    string_val=[payload.encode("utf-8") if isinstance(payload, str) else payload])
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])


def encode_coverage(chunk: int, groups: Mapping[str, Any],
                    in_no_optimizer: list[dict[str, Any]] | None = None) -> bytes:
    """The ``leafwatch/coverage/NNNNNN`` record of one chunk: zlib-compressed compact JSON
    (``in_no_optimizer`` only when there is one)."""
    record: dict[str, Any] = {"version": RECORD_VERSION, "chunk": chunk, "groups": dict(groups)}
    if in_no_optimizer:
        record["in_no_optimizer"] = list(in_no_optimizer)
    return zlib.compress(json.dumps(record, separators=(",", ":")).encode("utf-8"), 6)


def decode(payload: str | bytes) -> dict[str, Any] | None:
    """The document of one record (report or coverage), or None when it is not one this
    version of leafwatch can read (not JSON, not an object, or written by a newer version).

    Example::

        >>> decode(encode_report({"step": 3, "findings": []}))
        {'version': 3, 'step': 3, 'findings': []}
        >>> decode(encode_coverage(0, {}))["chunk"], decode(b"not json")
        (0, None)
    """
    try:
        if isinstance(payload, bytes):
            # Coverage records are zlib-compressed (zlib streams start with 0x78, "x").
            payload = (zlib.decompress(payload) if payload[:1] == b"x" else payload).decode("utf-8")
        data = json.loads(payload)
    except (ValueError, TypeError, zlib.error):
        return None
    if not isinstance(data, dict):
        return None
    version = data.get("version", RECORD_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version > RECORD_VERSION:
        return None
    return data


__all__ = ["COVERAGE_PREFIX", "FINDINGS_TEXT_TAG", "GRAD_COVERAGE_TAG", "LAYOUT_RUN", "OPEN_PREFIX", "PLUGIN_CONTENT",
           "PLUGIN_NAME", "RECORD_FORMAT", "RECORD_VERSION", "REPORT_TAG", "VERIFY_SUFFIX", "VERIFY_TAG", "coverage_tag",
           "decode", "encode_coverage", "encode_report", "is_coverage_tag", "layout", "open_tag", "tensor_summary"]

"""The ``torch-profiled`` command against hostile input and output paths (issue 29 items 13,
14 and 19): output files never replace a device, a FIFO or ``/dev/stdout``; odd or hostile
input exits 0, 2 with one line, or 3 (the gate inconclusive), never 1 (the gate's
"regression") and never a traceback;
names from files are printed with control characters escaped; JUnit output is valid XML.

Every command runs in a real child process (``tests._proc``): one child runs a whole class of
cases through ``instrument.cli.main`` (one torch import for all), with standard output a
strict UTF-8 stream as in a UTF-8 locale, where a lone surrogate raises."""

from __future__ import annotations

import copy
import gzip
import json
import os
import socket
import stat
import subprocess
import threading

import pytest
import torch

from instrument.base.files import TEMP_NAME
from tests import _proc

HERE = os.path.dirname(os.path.abspath(__file__))
JUNIT_XSDS = tuple(
    os.path.join(HERE, "data", "junit", name) for name in ("junit-10.xsd", "strict.xsd")
)

# names a trace or a metrics file may hold: terminal escapes (ESC, C1 CSI), a forged line,
# NUL, bidirectional override, lone surrogates (a file name that is not UTF-8), XML's
# non-characters and markup
HOSTILE_NAMES = (
    "\x1b[31mred\x1b[0m",
    "bell\x07nul\x00",
    "nl\nforged: line",
    "tab\tcr\r",
    "csi\x9b2J",
    "bidi\u202eevil",
    "load-\udcff.bin",
    "hi\ud800",
    "nonchar\ufffe",
    "<&>\"' markup",
)
RAW_FORBIDDEN = [chr(c) for c in (*range(0x00, 0x0A), *range(0x0B, 0x20), *range(0x7F, 0xA0))]
RAW_FORBIDDEN += ["\u202e", "\u2028"]

CHILD = r"""
import contextlib, io, json, sys
from instrument import cli

cases = json.load(open(sys.argv[1]))
results = []
for argv in cases:
    out, err = io.BytesIO(), io.BytesIO()
    # standard output as in a UTF-8 locale (errors strict), standard error as Python's own
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", errors="strict")
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace")
    try:
        rc = cli.main(argv)
    except BaseException as exc:  # noqa: BLE001 - the test reports it
        rc = "raised " + repr(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            stream.detach()  # (closing the wrapper would close the buffer)
        except Exception:
            pass
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    results.append({"rc": rc, "out": out.getvalue().decode("latin-1"),
                    "err": err.getvalue().decode("latin-1")})
json.dump(results, open(sys.argv[2], "w"))
"""


def _run_cases(tmp_path, cases: list[list[str]], timeout: float = 300) -> list[dict]:
    """Each ``argv`` of ``cases`` through ``cli.main`` in one real child process: its exit
    status and the bytes it wrote to standard output and error (latin-1 decoded)."""
    spec, results = tmp_path / "cases.json", tmp_path / "results.json"
    spec.write_text(json.dumps(cases))
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    done = _proc.run(str(child), str(spec), str(results), timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(results.read_text())


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A plain torch.profiler trace with two ranges (``a`` and ``b``), as a dict."""
    d = tmp_path_factory.mktemp("hostile")
    x = torch.randn(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        for name in ("a", "b", "a"):
            with torch.profiler.record_function(name):
                x @ x
    path = d / "base.json"
    p.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def _dump(path, trace) -> str:
    path.write_text(json.dumps(trace))  # ensure_ascii: lone surrogates as \udcff escapes
    return str(path)


def _named(trace: dict, names: dict[str, str]) -> dict:
    out = copy.deepcopy(trace)
    for ev in out["traceEvents"]:
        if ev.get("name") in names:
            ev["name"] = names[ev["name"]]
    return out


def _assert_clean(text: str, where) -> None:
    """Printed text: valid UTF-8, no raw control character but line breaks."""
    raw = text.encode("latin-1")
    raw.decode("utf-8")  # raises on invalid UTF-8 (a surrogate written with surrogateescape)
    decoded = raw.decode("utf-8")
    bad = sorted({c for c in decoded if c in RAW_FORBIDDEN})
    assert not bad, (where, bad, decoded[:2000])


# ---------------------------------------------------------------- item 14: hostile input


def _trace_corpus(d, base: dict) -> dict[str, str]:
    """File name -> path of traces that are odd or hostile in every way we know of."""
    files: dict[str, bytes] = {}
    text = json.dumps(base)
    files["truncated.json"] = text[: len(text) // 2].encode()
    files["invalid_utf8.json"] = text[:200].encode() + b"\xff\xfe\xc0" + text[200:].encode()
    files["nan.json"] = text.replace('"dur": ', '"dur": NaN, "x": ', 1).encode()
    files["infinity.json"] = text.replace('"ts": ', '"ts": -Infinity, "y": ', 1).encode()
    files["overflow.json"] = text.replace('"ts": ', '"ts": 1e999, "y": ', 3).encode()
    files["empty.json"] = b""
    files["spaces.json"] = b"  \n "
    files["garbage.json.gz"] = os.urandom(3000)
    files["gzip_of_garbage.json.gz"] = gzip.compress(os.urandom(3000))
    files["deep.json"] = b'{"traceEvents": [' + b"[" * 200_000 + b"]" * 200_000 + b"]}"
    files["huge.json"] = b'{"traceEvents": [], "pad": "' + b"x" * (2 << 20) + b'"}'  # --max-mb 1
    for name, data in files.items():
        (d / name).write_bytes(data)
    paths = {name: str(d / name) for name in files}
    names = {"a": HOSTILE_NAMES[0], "b": HOSTILE_NAMES[6]}
    paths["names.json"] = _dump(d / "names.json", _named(base, names))
    for i, name in enumerate(HOSTILE_NAMES):
        paths[f"name{i}.json"] = _dump(d / f"name{i}.json", _named(base, {"a": name}))
    odd = (None, "x", -1, 10**30, 1e308, [], {}, True, "\udcff\x1b[2J", [1, 2])
    for key in ("name", "ph", "cat", "ts", "dur", "pid", "tid", "args"):
        for i, value in enumerate(odd):
            for which in ("one", "all"):
                t = copy.deepcopy(base)
                evs = [e for e in t["traceEvents"] if e.get("cat") in ("user_annotation", "cpu_op")]
                for ev in evs[:1] if which == "one" else evs:
                    ev[key] = value
                paths[f"{key}{i}_{which}.json"] = _dump(d / f"{key}{i}_{which}.json", t)
    for key in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds", "host_name"):
        for i, value in enumerate(
            (*odd, {"rank": 1e300, "world_size": "x"}, {"rank": -5}, [{"name": {"a": 1}}])
        ):
            paths[f"top_{key}{i}.json"] = _dump(d / f"top_{key}{i}.json", {**base, key: value})
    (d / "empty_dir").mkdir()
    (d / "dir_named_json.json").mkdir()  # a directory where a trace file is expected
    paths["empty_dir"] = str(d / "empty_dir")
    paths["dir_named_json.json"] = str(d / "dir_named_json.json")
    return paths


def test_hostile_traces_exit_0_or_2_with_one_clean_line_never_1(tmp_path, base):
    good = _dump(tmp_path / "good.json", base)
    corpus = _trace_corpus(tmp_path, base)
    cases = []
    for path in corpus.values():
        cases += [
            ["summarize", path, "--max-mb", "1"],
            ["summarize", "--json", path, "--max-mb", "1"],
            ["diff", path, good, "--max-mb", "1"],
            ["diff", path, path, "--fail-over", "10%", "--junit", str(tmp_path / "j.xml")],
            ["report", path, "-o", str(tmp_path / "r.html"), "--max-mb", "1"],
        ]
    results = _run_cases(tmp_path, cases)
    seen = set()
    for argv, res in zip(cases, results):
        rc, out, err = res["rc"], res["out"], res["err"]
        assert rc in (0, 2, 3), (argv, rc, err)  # never 1 (a regression), never an exception
        if rc == 3:  # one window a side: the gate is inconclusive, and nothing else exits 3
            assert argv[0] == "diff" and "--fail-over" in argv, (argv, out)
        assert "Traceback" not in err and "unexpected" not in err, (argv, err)
        if rc == 2:
            assert out == "" and err.startswith("torch-profiled: error: "), (argv, out, err)
            assert err.count("\n") == 1 and "; expected " in err, (argv, err)
        if argv[0] == "diff" and "--fail-over" in argv:
            assert rc != 1, (argv, out)  # a trace against itself is no regression
        _assert_clean(out, argv)
        _assert_clean(err, argv)
        if "--json" in argv and rc == 0:
            json.loads(out)  # valid JSON: no NaN or Infinity
            assert "NaN" not in out and "Infinity" not in out, argv
        seen.add(rc)
    assert seen == {0, 2, 3}  # every kind is in the corpus


def test_hostile_names_are_printed_escaped_in_every_command(tmp_path, base):
    slower = copy.deepcopy(base)
    for ev in slower["traceEvents"]:
        if ev.get("ph") == "X":
            ev["dur"] = ev["dur"] * 5
            ev["ts"] = ev["ts"] * 5
    names = {"a": HOSTILE_NAMES[0], "b": HOSTILE_NAMES[2]}
    a = _dump(tmp_path / "a.json", _named(base, names))
    b = _dump(tmp_path / "b.json", _named(slower, names))
    cases = [
        ["summarize", a],
        ["summarize", a, b],
        ["diff", a, b],
        ["diff", a, b, "--fail-over", "10%"],
        ["report", a, "-o", str(tmp_path / "r.html")],
        ["summarize", a, "--range", "\x1b[2Jnope"],
    ]
    results = _run_cases(tmp_path, cases)
    for argv, res in zip(cases, results):
        _assert_clean(res["out"], argv)
        _assert_clean(res["err"], argv)
    texts = [r["out"] for r in results[:4]]
    for argv, text in zip(cases, texts):
        assert "\\x1b[31mred\\x1b[0m" in text, (argv, text)  # shown, not obeyed
        assert "nl\\nforged: line" in text, (argv, text)  # one name, one line
    # one window a side: inconclusive (exit 3), five times slower or not
    assert results[3]["rc"] == 3 and "INCONCLUSIVE" in results[3]["out"]
    assert results[4]["rc"] == 0 and results[4]["out"].startswith("wrote ")
    assert results[5]["rc"] == 2 and "\\x1b[2Jnope" in results[5]["err"]
    # the table's columns hold: every rank-row and range-row within 100 columns
    for line in results[0]["out"].splitlines():
        assert len(line) <= 100, line


def _records(rank: int, names, /, **over) -> dict:
    stats = {"count": 3, "sum_s": 0.3, "min_s": 0.1, "p50_s": 0.1, "p90_s": 0.1}
    stats.update({"p99_s": 0.1, "max_s": 0.1})
    rec = {
        "schema": "torch-profiled/metrics/1",
        "time_ns": 2,
        "since_ns": 1,
        "rank": rank,
        "world_size": 2,
        "host": "h",
        "pid": 10 + rank,
        "ranges": {n: dict(stats) for n in names},
        "steps": dict(stats),
    }
    rec.update(over)
    return rec


def test_hostile_metrics_records_exit_0_or_2_with_one_clean_line(tmp_path):
    good = json.dumps(_records(0, ["a"])) + "\n"
    lines = {
        "truncated.jsonl": good[: len(good) // 2],
        "invalid_utf8.jsonl": good.replace('"h"', '"h\udcff"').encode("utf-8", "surrogateescape"),
        "surrogates.jsonl": json.dumps(_records(0, HOSTILE_NAMES)) + "\n",
        "nan.jsonl": good.replace('"p50_s": 0.1', '"p50_s": NaN', 1),
        "infinity.jsonl": good.replace('"max_s": 0.1', '"max_s": Infinity', 1),
        "overflow.jsonl": good.replace('"sum_s": 0.3', '"sum_s": 1e999', 1),
        "huge_int.jsonl": good.replace('"sum_s": 0.3', '"sum_s": ' + "9" * 400, 1),
        "empty.jsonl": "",
        "blank.jsonl": "\n\n  \n",
        "deep.jsonl": '{"schema": ' + "[" * 100_000 + "]" * 100_000 + "}\n" + good,
        "huge_line.jsonl": good + json.dumps(_records(1, ["x" * (2 << 20)])) + "\n",
        "gzip_garbage.jsonl": gzip.compress(os.urandom(4000)),
        "garbage.jsonl": os.urandom(4000),
    }
    odd = (None, "x", -1.5, [], {}, True, 10**30, "\udcff\x1b]0;title\x07")
    for key in ("rank", "pid", "time_ns", "host", "ranges", "steps", "world_size", "schema"):
        for i, value in enumerate(odd):
            lines[f"{key}{i}.jsonl"] = good + json.dumps(_records(1, ["a"], **{key: value})) + "\n"
    for i, value in enumerate(odd):
        lines[f"stat{i}.jsonl"] = json.dumps(_records(0, ["a"], ranges={"a": {"p50_s": value}}))
    paths = {}
    for name, data in lines.items():
        (tmp_path / name).write_bytes(data.encode() if isinstance(data, str) else data)
        paths[name] = str(tmp_path / name)
    (tmp_path / "dir.jsonl").mkdir()
    paths["dir.jsonl"] = str(tmp_path / "dir.jsonl")
    cases = []
    for path in paths.values():
        cases += [
            ["summarize", path, "--max-mb", "1"],
            ["summarize", "--json", path, "--max-mb", "1"],
        ]
    results = _run_cases(tmp_path, cases)
    by_name = {}
    for argv, res in zip(cases, results):
        rc, out, err = res["rc"], res["out"], res["err"]
        assert rc in (0, 2), (argv, rc, err)
        assert "Traceback" not in err and "unexpected" not in err, (argv, err)
        if rc == 2:
            assert out == "" and err.count("\n") == 1 and "; expected " in err, (argv, err)
        _assert_clean(out, argv)
        _assert_clean(err, argv)
        if "--json" in argv and rc == 0:
            json.loads(out)
            assert "NaN" not in out and "Infinity" not in out, argv
        by_name[os.path.basename(argv[1] if argv[1] != "--json" else argv[2]), "--json" in argv] = (
            res
        )
    huge = by_name["huge_line.jsonl", False]
    assert (
        huge["rc"] == 2 and f"{paths['huge_line.jsonl']}: line 2 is longer than 1 MB" in huge["err"]
    )
    assert "--max-mb" in huge["err"]
    for name in ("nan.jsonl", "infinity.jsonl", "overflow.jsonl"):
        assert by_name[name, False]["rc"] == 2, (name, by_name[name, False])
    shown = by_name["surrogates.jsonl", False]
    assert shown["rc"] == 0 and "load-\\udcff.bin" in shown["out"]
    assert "\\x1b[31mred" in shown["out"]


METRICS_PROGRAM = r"""
import os, time
from instrument import profiled

names = [os.fsdecode(b"load-\xff.bin"), "\x1b[31mred\x1b[0m", "nl\nforged", "csi\x9b2J"]
calls = [profiled(n)(lambda: time.sleep(0.001)) for n in names]

@profiled("train", step=True)
def train():
    for call in calls:
        call()

for _ in range(10):
    train()
print("done")
"""


def test_summarize_of_the_sdks_own_records_with_odd_names_in_a_utf8_locale(tmp_path):
    """The json exporter's records of a real program whose range names are a file name that
    is not UTF-8 and terminal escapes; ``summarize`` in a real process whose standard output
    is strict UTF-8 (``PYTHONIOENCODING=utf-8``, as in a UTF-8 locale): exit 0, names
    escaped (was: exit 1, "unexpected UnicodeEncodeError")."""
    prog = tmp_path / "prog.py"
    prog.write_text(METRICS_PROGRAM)
    records = tmp_path / "m.jsonl"
    env = _proc.sdk_env(
        PROFILED_EXPORTERS="json",
        PROFILED_JSON_PATH=str(records),
        PROFILED_METRICS="1",
        PROFILED_METRICS_INTERVAL_S="0.2",
        # no window: metrics only (a profiler window and such names is another finding's)
        PROFILED_SCHEDULE="wait=100000,warmup=1,active=1,repeat=1,skip_first=0",
    )
    ran = _proc.run(str(prog), env=env, cwd=tmp_path, timeout=180)
    assert ran.returncode == 0 and "done" in ran.stdout, ran.stderr[-3000:]
    env = _proc.sdk_env(PYTHONIOENCODING="utf-8")
    for argv in (["summarize", str(records)], ["summarize", "--json", str(records)]):
        done = subprocess.run(
            [_proc.sys.executable, "-m", "instrument", *argv],
            env=env,
            capture_output=True,
            timeout=180,
        )
        out, err = done.stdout.decode("utf-8"), done.stderr.decode("utf-8")
        assert done.returncode == 0, err
        assert err == ""
        _assert_clean(out.encode().decode("latin-1"), argv)
        if "--json" in argv:
            names = set(json.loads(out)["ranks"]["0"]["ranges"])
            # the decorator escapes a name torch cannot take where it is given
            assert "load-%FF.bin" in names and "nl\nforged" in names
        else:
            for shown in ("load-%FF.bin", "\\x1b[31mred\\x1b[0m", "nl\\nforged", "csi\\x9b2J"):
                assert shown in out, (shown, out)


# ---------------------------------------------------------------- item 19: JUnit is XML


def test_junit_is_valid_xml_whatever_the_names_hold(tmp_path, base):
    from lxml import etree  # the dev extra's XML Schema validator

    schemas = [etree.XMLSchema(etree.parse(xsd)) for xsd in JUNIT_XSDS]
    slower = copy.deepcopy(base)
    for ev in slower["traceEvents"]:
        if ev.get("ph") == "X":
            ev["ts"], ev["dur"] = ev["ts"] * 5, ev["dur"] * 5
    cases, outs = [], []
    for i, name in enumerate(HOSTILE_NAMES):
        names = {"a": name, "b": HOSTILE_NAMES[(i + 1) % len(HOSTILE_NAMES)]}
        before = _dump(tmp_path / f"before{i}.json", _named(base, names))
        after = _dump(tmp_path / f"after{i}.json", _named(slower, names))
        out = str(tmp_path / f"j{i}.xml")
        outs.append(out)
        cases.append(["diff", before, after, "--fail-over", "10%", "--junit", out])
    results = _run_cases(tmp_path, cases)
    for argv, res, out in zip(cases, results, outs):
        assert res["rc"] == 3, (argv, res)  # five times slower, one window a side: inconclusive
        doc = etree.parse(out)  # well-formed XML 1.0 (lxml refuses control characters)
        for xsd, schema in zip(JUNIT_XSDS, schemas):
            assert schema.validate(doc), (argv, xsd, schema.error_log)
        inconclusive = doc.getroot().findall(".//skipped")
        assert inconclusive and inconclusive[0].get("message").startswith("inconclusive: ")
        shown = {c.get("name") for c in doc.getroot().iter("testcase")}
        assert len(shown) == 2, shown
    first = etree.parse(outs[0]).getroot()
    assert {c.get("name") for c in first.iter("testcase")} == {
        "\\x1b[31mred\\x1b[0m",  # ESC shown as its escape, not dropped
        "bell\\x07nul\\x00",
    }


# ---------------------------------------------------------------- item 13: output paths


def _mknod(path, kind: int, dev: int) -> bool:
    try:
        os.mknod(path, kind | 0o666, dev)
    except (PermissionError, OSError):
        return False
    return True


def _read_fifo(path, into: list) -> threading.Thread:
    def read():
        with open(path, "rb") as f:
            into.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def _nodes(d) -> dict[str, str]:
    """Every kind of thing an output path may name (those this user can make)."""
    d.mkdir()
    made = {}
    os.mkfifo(d / "fifo")
    made["fifo"] = str(d / "fifo")
    if _mknod(d / "null", stat.S_IFCHR, os.makedev(1, 3)):  # a copy of /dev/null (root)
        made["chardev"] = str(d / "null")
    if _mknod(d / "full", stat.S_IFCHR, os.makedev(1, 7)):  # a copy of /dev/full: ENOSPC
        made["full"] = str(d / "full")
    if _mknod(d / "disk", stat.S_IFBLK, os.makedev(7, 250)):  # a loop device's node (root)
        made["blockdev"] = str(d / "disk")
    (d / "dir").mkdir()
    made["dir"] = str(d / "dir")
    os.symlink(d / "nowhere", d / "dangling")
    made["dangling"] = str(d / "dangling")
    (d / "target.out").write_text("old\n")
    os.symlink("target.out", d / "link")
    made["link"] = str(d / "link")
    os.symlink(d / "dir", d / "link_to_dir")
    made["link_to_dir"] = str(d / "link_to_dir")
    os.symlink("/dev/null", d / "link_to_null")
    made["link_to_null"] = str(d / "link_to_null")
    (d / "regular.out").write_text("old\n")
    made["regular"] = str(d / "regular.out")
    made["new"] = str(d / "new.out")
    shared = d / "shared"  # a /tmp-like directory: sticky, writable by everyone
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (d / "victim.out").write_text("precious\n")
    os.symlink(d / "victim.out", shared / "planted")
    try:  # another user's link (root can make one): the kernel would not follow it here
        os.lchown(shared / "planted", 4242, 4242)
        made["planted"] = str(shared / "planted")
    except PermissionError:
        pass
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    sock.close()
    made["socket"] = str(d / "sock")
    return made


WRITTEN_IN_PLACE = {"fifo", "chardev", "link_to_null"}
REFUSED = {"blockdev", "dir", "dangling", "link_to_dir", "socket", "planted", "full"}
REPLACED = {"regular", "new"}


def _snapshot(path: str):
    st = os.lstat(path)
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return (stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, link)


@pytest.mark.parametrize("writer", ["report -o", "diff --junit"])
def test_output_paths_are_written_in_place_or_refused_never_replaced(tmp_path, base, writer):
    """As root (this box, CI containers): every kind of path an output option may name. A
    device, a FIFO or a link to one is written in place; a directory, a block device, a
    socket, a dangling link is refused with one line and exit 2; none is replaced. A link to a
    regular file keeps the link, its target gets the document; a regular file is replaced
    whole; no temporary file is left."""
    a = _dump(tmp_path / "a.json", base)
    nodes = _nodes(tmp_path / "out")
    before = {k: _snapshot(p) for k, p in nodes.items() if k != "new"}
    got: list = []
    reader = _read_fifo(nodes["fifo"], got)
    cases = []
    for path in nodes.values():
        if writer == "report -o":
            cases.append(["report", a, "-o", path])
        else:
            cases.append(["diff", a, a, "--fail-over", "10%", "--junit", path])
    try:
        results = _run_cases(tmp_path, cases)
    finally:
        if reader.is_alive():  # the writer never came: release the reader
            os.close(os.open(nodes["fifo"], os.O_WRONLY | os.O_NONBLOCK))
    reader.join(60)
    marker = b"<!doctype html>" if writer == "report -o" else b"<?xml"
    for (kind, path), res in zip(nodes.items(), results):
        rc, err = res["rc"], res["err"]
        assert "Traceback" not in err and "unexpected" not in err, (kind, err)
        if kind in REFUSED:
            assert rc == 2 and err.count("\n") == 1, (kind, rc, err)
            assert err.startswith(f"torch-profiled: error: {path}: "), (kind, err)
            assert "expected" in err and ("--junit" in err or "-o" in err), (kind, err)
        else:  # a trace against itself, one window a side: the gate is inconclusive
            assert rc == (3 if writer == "diff --junit" else 0), (kind, rc, err)
        if kind in WRITTEN_IN_PLACE or kind in REFUSED:
            assert _snapshot(path) == before[kind], (kind, "replaced")
        if kind == "dir":
            assert os.listdir(path) == []
        if kind == "dangling":
            assert not os.path.exists(tmp_path / "out" / "nowhere")
        if kind == "full":  # written in place, and the device said no: one line, exit 2
            assert "cannot be written (No space left on device" in err, err
        if kind == "planted":
            assert "shared sticky directory" in err, err
            assert (tmp_path / "out" / "victim.out").read_text() == "precious\n"
        if kind == "link":
            assert _snapshot(path) == before[kind]  # still the same link
            assert (tmp_path / "out" / "target.out").read_bytes().lstrip().startswith(marker)
        if kind in REPLACED:
            assert open(path, "rb").read().lstrip().startswith(marker), kind
    assert got and got[0].lstrip().startswith(marker), got  # the FIFO's reader got it all
    if writer == "report -o":
        assert got[0].rstrip().endswith(b"</html>")
    else:
        assert got[0].rstrip().endswith(b"</testsuites>")
    leftovers = [n for n in os.listdir(tmp_path / "out") if TEMP_NAME.fullmatch(n)]
    assert leftovers == []
    if "chardev" not in nodes:
        pytest.skip("not root: device nodes could not be made (the rest was checked)")


STDOUT_CHILD = r"""
import os, sys
from instrument import cli

trace, link, log = sys.argv[1:4]
# 1. standard output is the test's pipe: /dev/stdout-like link into /proc
rc1 = cli.main(["report", trace, "-o", link])
rc2 = cli.main(["diff", trace, trace, "--fail-over", "10%", "--junit", link])
sys.stdout.flush()
# 2. standard output a regular file, already written to: the output follows what is there
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(fd, 1)
os.close(fd)
sys.stdout.write("header line\n")
rc3 = cli.main(["report", trace, "-o", link])
sys.stdout.flush()
sys.stderr.write(f"STATUS {rc1} {rc2} {rc3}\n")
"""


def test_own_stdout_as_the_output_is_streamed_into_never_replaced(tmp_path, base):
    """``-o /dev/stdout`` (here a link of the same kind, ``/proc/self/fd/1``: the real one
    must not be put at risk): the page and the JUnit file go into the process's standard
    output, a pipe and then a regular file that already holds a line; the link stays; the
    line each command prints goes to standard error instead."""
    a = _dump(tmp_path / "a.json", base)
    link = tmp_path / "stdout"
    os.symlink("/proc/self/fd/1", link)
    log = tmp_path / "log.txt"
    child = tmp_path / "child.py"
    child.write_text(STDOUT_CHILD)
    done = _proc.run(str(child), a, str(link), str(log), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "STATUS 0 3 0" in done.stderr, done.stderr[-3000:]  # the gate: inconclusive
    assert os.readlink(link) == "/proc/self/fd/1"  # still the link
    out = done.stdout
    page_end = out.index("</html>")
    assert out.lstrip().startswith("<!doctype html>")
    xml = out[page_end + len("</html>") :].strip()
    assert xml.startswith("<?xml") and xml.endswith("</testsuites>"), xml[-300:]
    assert "wrote " in done.stderr and "INCONCLUSIVE" in done.stderr  # the lines: stderr
    text = log.read_text()
    assert text.startswith("header line\n<!doctype html>"), text[:200]
    assert text.rstrip().endswith("</html>")

#!/usr/bin/env python3
"""exp.py OUT --bin LABEL=PATH [--bin ...] --side NAME=PROTO[:FLAGS] [...] [--cells rw/bs/depth,...]
          [--reps 3] [--secs 3] [--size 1GiB]

Issue 30's cells with arbitrary `ipsan bench` flags per side (scripts/bench nvme fixes them):
one `ipsan target` per binary (RAM LUN, iSCSI and NVMe/TCP on loopback, filled once), every
(binary, side) of a cell back to back in an order alternating rep by rep, as scripts/bench nvme
does; per run MiB/s, the client's CPU (its JSON report) and the target's (/proc/PID/stat).
PROTO is iscsi or nvme; FLAGS are extra `ipsan bench` flags, space-separated
(e.g. `nvme:--queues 2 --threads 2`). Prints one line per run and a median (min-max) table;
writes raw.jsonl and the bench JSON reports into OUT.
"""
import argparse, json, os, re, statistics, subprocess, sys, time

TICK = os.sysconf("SC_CLK_TCK")
IQN = "iqn.2026-11.org.ipsan:nvspeed4"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-6265-6e63-6800-000000000004"
procs = []

def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK

def thread_cpu(pid):
    """CPU seconds per thread of process `pid` (utime + stime)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            pass
    return out


def start_target(binary, size, log):
    p = subprocess.Popen([binary, "target", "--portal", "127.0.0.1:0", "--iqn", IQN, "--lun",
                          f"mem:{size}", "--nvme-listen", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    procs.append(p)
    iscsi = nvme = None
    t = time.time() + 20
    while time.time() < t and (iscsi is None or nvme is None):
        line = p.stdout.readline()
        if not line:
            break
        m = re.search(r"serving (iscsi://\S+)", line)
        iscsi = m.group(1) if m else iscsi
        m = re.search(r"serving (nvme\+tcp://\S+)", line)
        nvme = m.group(1) if m else nvme
    if not iscsi or not nvme:
        sys.exit("target did not start")
    subprocess.run([binary, "bench", iscsi, "--rw", "write", "--bs", "1MiB", "--depth", "8",
                    "--size", size, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    return p, {"iscsi": iscsi, "nvme": nvme}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bin", action="append", required=True)
    ap.add_argument("--side", action="append", required=True)
    ap.add_argument("--cells", default="read/1MiB/16,randread/4KiB/32,randwrite/4KiB/32,read/64KiB/1,write/64KiB/1,write/1MiB/16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--secs", type=int, default=3)
    ap.add_argument("--size", default="1GiB")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    bins = [b.split("=", 1) for b in a.bin]
    sides = []
    for s in a.side:
        name, spec = s.split("=", 1)
        proto, _, flags = spec.partition(":")
        extra = flags.split() if flags else []
        if proto == "nvme":
            extra += ["--hostnqn", HOSTNQN]
        sides.append((name, proto, extra))
    cells = [(c.split("/")[0], c.split("/")[1], int(c.split("/")[2])) for c in a.cells.split(",")]
    targets = {}
    for label, path in bins:
        targets[label] = (path, *start_target(path, a.size, os.path.join(a.out, f"target-{label}.log")))
    keys = [(l, s) for l, _ in bins for s in sides]
    meta = {"cmd": sys.argv, "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_start": open("/proc/loadavg").read().split()[:3],
            "nice": os.nice(0),
            "halt_poll": open("/sys/module/haltpoll/parameters/guest_halt_poll_ns").read().strip()}
    raw = open(os.path.join(a.out, "raw.jsonl"), "a")
    res = {}
    n = 0
    for rep in range(1, a.reps + 1):
        for c in cells:
            order = keys if rep % 2 else keys[::-1]
            for (label, (name, proto, extra)) in order:
                path, tp, urls = targets[label]
                js = os.path.join(a.out, f"bench-{label}-{name}-{c[0]}-{c[1]}-{rep}.json")
                t0 = proc_cpu(tp.pid)
                th0 = thread_cpu(tp.pid)
                subprocess.run([path, "bench", urls[proto], "--rw", c[0], "--bs", c[1], "--depth",
                                str(c[2]), "--time", f"{a.secs}s", "--quiet", "--json", js, *extra],
                               check=True, stdout=subprocess.DEVNULL, timeout=a.secs * 4 + 60)
                tcpu = proc_cpu(tp.pid) - t0
                th1 = thread_cpu(tp.pid)
                busy = sorted((th1[t] - th0.get(t, 0) for t in th1), reverse=True)[:3]
                r = json.load(open(js))["result"]
                gb = r["bytes"] / 1e9
                ccpu = r["cpu"]["user_s"] + r["cpu"]["sys_s"]
                row = {"rep": rep, "cell": "/".join(map(str, c)), "bin": label, "side": name,
                       "mib_s": r["throughput_mib_s"], "iops": r["iops"],
                       "client_cpu_gb": ccpu / gb, "target_cpu_gb": tcpu / gb,
                       "p50_us": r["latency_us"].get("p50"), "load": open("/proc/loadavg").read().split()[0],
                       "secs": r.get("duration_s") or r.get("elapsed_s") or a.secs,
                       "client_cpu_s": ccpu, "target_thread_cpu_s": [round(x, 2) for x in busy]}
                raw.write(json.dumps(row) + "\n"); raw.flush()
                res.setdefault((row["cell"], label, name), []).append(row)
                print(f"rep {rep} {row['cell']:18} {label:6} {name:12} {row['mib_s']:8.1f} MiB/s "
                      f"client {row['client_cpu_gb']:.2f} target {row['target_cpu_gb']:.2f} CPU-s/GB; "
                      f"client {ccpu:.2f} s, target threads {row['target_thread_cpu_s']} s; load {row['load']}", flush=True)
    meta["end"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta["load_end"] = open("/proc/loadavg").read().split()[:3]
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1)
    sp = lambda xs, f="{:.0f}": f"{f.format(statistics.median(xs))} ({f.format(min(xs))}–{f.format(max(xs))})"
    print(f"\n{meta}\n\n| cell | bin | side | MiB/s | ÷ first side | client CPU-s/GB | target CPU-s/GB |\n|---|---|---|---:|---:|---:|---:|")
    for c in cells:
        cell = "/".join(map(str, c))
        base = statistics.median(r["mib_s"] for r in res[(cell, keys[0][0], keys[0][1][0])])
        for label, (name, _, _) in keys:
            rs = res[(cell, label, name)]
            m = statistics.median(r["mib_s"] for r in rs)
            print(f"| {cell} | {label} | {name} | {sp([r['mib_s'] for r in rs])} | {m / base:.2f} | "
                  f"{sp([r['client_cpu_gb'] for r in rs], '{:.2f}')} | {sp([r['target_cpu_gb'] for r in rs], '{:.2f}')} |")

try:
    main()
finally:
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()

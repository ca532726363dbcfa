#!/usr/bin/env python3
"""What a lone lost small segment costs, and what a later small segment (a tail probe) saves
(README.md "The tail probe alone"): over an `ipsan wan` link at 32 ms one way with loss only
from the client's side to the server's, a client sends a 50-byte request, waits for a 1-byte
answer, 0.05 s apart, `--n` times; the round trips over 2 RTTs are requests that were lost
and resent. Four clients, alternated twice: the kernel's minimum RTO (200 ms: a kernel before
6.15, which refuses TCP_RTO_MIN_US); the same plus a 48-byte probe `--probe-ms` after each
request still unanswered (what ipsan's tail probe does; the server drops probe bytes);
TCP_RTO_MIN_US = 20 ms (what every MC/S connection sets where the kernel allows); 20 ms plus
the probe. Run as root from
the repository root (mcs-sweep-3/lone-loss.py without the probe):
    lone-probe.py IPSAN_BIN [--n 150] [--loss 5%] [--probe-ms 5]"""
import json, os, select, socket, subprocess, sys, time

REQ, PROBE = b"R" * 50, b"P" * 48

def serve():
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 5078)); srv.listen(4)
    while True:
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        have = 0
        while True:
            d = c.recv(1000)
            if not d:
                break
            have += d.count(b"R")
            while have >= len(REQ):
                have -= len(REQ)
                c.send(b"k")

def client(host, n, rto_min_us, probe_ms):
    cl = socket.socket(); cl.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if rto_min_us:
        cl.setsockopt(socket.IPPROTO_TCP, 45, rto_min_us)  # TCP_RTO_MIN_US
    cl.connect((host, 5078))
    out, probes = [], 0
    for _ in range(n):
        t0 = time.monotonic(); cl.send(REQ)
        if probe_ms:
            r, _, _ = select.select([cl], [], [], probe_ms / 1000)
            if not r:
                cl.send(PROBE); probes += 1
        cl.recv(10)
        out.append(round((time.monotonic() - t0) * 1000, 1))
        time.sleep(0.05)
    return out, probes

def main():
    if sys.argv[1] == "--serve":
        return serve()
    if sys.argv[1] == "--client":
        print(json.dumps(client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))))
        return
    b = sys.argv[1]
    arg = lambda k, d: sys.argv[sys.argv.index(k) + 1] if k in sys.argv else d
    n, loss, probe_ms = int(arg("--n", "150")), arg("--loss", "5%"), float(arg("--probe-ms", "5"))
    name = f"lprb{os.getpid() % 1000}"
    subprocess.run([b, "wan", "up", "--name", name, "--subnet", "10.231.79.0/24", "--delay", "32ms",
                    "--rate", "0", "--loss-up", loss, "--loss-down", "0%"], check=True)
    srv = subprocess.Popen(["ip", "netns", "exec", f"{name}-tgt", sys.executable, __file__, "--serve"])
    try:
        time.sleep(1)
        for _ in range(2):
            for rto, pm, label in ((0, 0, "kernel RTO min"),
                                   (0, probe_ms, f"kernel RTO min + probe after {probe_ms:g} ms"),
                                   (20000, 0, "RTO min 20 ms"),
                                   (20000, probe_ms, f"RTO min 20 ms + probe after {probe_ms:g} ms")):
                r = subprocess.run(["ip", "netns", "exec", f"{name}-ini", sys.executable, __file__,
                                    "--client", "10.231.79.2", str(n), str(rto), str(pm)],
                                   capture_output=True, text=True, check=True)
                rtts, probes = json.loads(r.stdout)
                late = sorted(x for x in rtts if x > 128)
                extra = [round(x - 64, 1) for x in late]
                print(json.dumps({"client": label, "requests": n, "loss_up": loss, "probes": probes,
                                  "resent": len(late), "extra_ms_sorted": extra,
                                  "median_extra_ms": extra[len(extra) // 2] if extra else None}),
                      flush=True)
    finally:
        srv.terminate(); srv.wait()
        subprocess.run([b, "wan", "down", "--name", name])

main()

#!/usr/bin/env python3
"""What a lone lost small segment costs (README.md "Why reads fell short"): over an `ipsan wan`
link with loss only from the initiator's side to the target's, a client sends a 50-byte
request, waits for a 1-byte answer, 0.05 s apart, `--n` times; the round trips over 2 RTTs are
requests that were lost and resent. Run as root from the repository root:
    lone-loss.py IPSAN_BIN [--n 200] [--loss 5%]
once with the kernel's minimum RTO and once with TCP_RTO_MIN_US = 20 ms on the client."""
import json, os, socket, subprocess, sys, time

def serve():
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 5077)); srv.listen(4)
    while True:
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            d = c.recv(100)
            if not d:
                break
            c.send(b"k")

def client(host, n, rto_min_us):
    cl = socket.socket(); cl.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if rto_min_us:
        cl.setsockopt(socket.IPPROTO_TCP, 45, rto_min_us)  # TCP_RTO_MIN_US
    cl.connect((host, 5077))
    out = []
    for _ in range(n):
        t0 = time.monotonic(); cl.send(b"X" * 50); cl.recv(10)
        out.append(round((time.monotonic() - t0) * 1000, 1))
        time.sleep(0.05)
    return out

def main():
    if sys.argv[1] == "--serve":
        return serve()
    if sys.argv[1] == "--client":
        print(json.dumps(client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return
    b = sys.argv[1]
    n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 200
    loss = sys.argv[sys.argv.index("--loss") + 1] if "--loss" in sys.argv else "5%"
    name = f"lone{os.getpid() % 1000}"
    subprocess.run([b, "wan", "up", "--name", name, "--subnet", "10.231.78.0/24", "--delay", "32ms",
                    "--rate", "0", "--loss-up", loss, "--loss-down", "0%"], check=True)
    srv = subprocess.Popen(["ip", "netns", "exec", f"{name}-tgt", sys.executable, __file__, "--serve"])
    try:
        time.sleep(1)
        for rto in (0, 20000, 0, 20000):
            r = subprocess.run(["ip", "netns", "exec", f"{name}-ini", sys.executable, __file__,
                                "--client", "10.231.78.2", str(n), str(rto)],
                               capture_output=True, text=True, check=True)
            rtts = json.loads(r.stdout)
            late = sorted(x for x in rtts if x > 128)
            extra = [round(x - 64, 1) for x in late]
            print(json.dumps({"rto_min_us": rto or "kernel (200000)", "requests": n,
                              "loss_up": loss, "resent": len(late),
                              "extra_ms_sorted": extra,
                              "median_extra_ms": extra[len(extra) // 2] if extra else None}))
    finally:
        srv.terminate(); srv.wait()
        subprocess.run([b, "wan", "down", "--name", name])

main()

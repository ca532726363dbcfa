#!/usr/bin/env python3
# Replays the per-binary times of a `cargo test --workspace` log (default: the 1,341 s fresh-clone
# run) through scripts/run-tests' PLAN and scheduler, as if each binary took as long beside
# others as it did alone: an estimate of the tests phase in 1-4 lanes, not a measurement.
# Usage (from the repository root): python3 docs/results/test-time/lanes/replay.py [LOG]
import re,sys,importlib.util,importlib.machinery
loader=importlib.machinery.SourceFileLoader("rt","scripts/run-tests")
spec=importlib.util.spec_from_loader("rt",loader); rt=importlib.util.module_from_spec(spec); loader.exec_module(rt)
lines=open(sys.argv[1] if len(sys.argv) > 1 else "docs/results/test-time/after-fresh-clone.log").read().splitlines()
pkg=None; cur=None; times={}
for l in lines:
    m=re.match(r"\s+Running (\S+) \(.*/deps/([a-z0-9_]+)-[0-9a-f]+\)",l)
    if m:
        src,crate=m.groups()
        if src.startswith("unittests"):
            pkg=crate.replace("_","-") if crate!="ipsan" else "ipsan"
            cur=f"{pkg}/lib" if src.endswith("lib.rs") else f"{pkg}/bin-ipsan"
        else:
            cur=f"{pkg}/{src[6:-3]}"
    m=re.search(r"finished in ([0-9.]+)s",l)
    if m and cur: times[cur]=float(m.group(1)); cur=None
times["doc-tests"]=17  # lanes/run.log: cargo prints no time for them
print(len(times), sum(times.values()))
def sim(lanes):
    order=sorted(times,key=lambda n:("solo" in rt.claims(n),-rt.estimate(n),n))
    s=rt.Scheduler(); t=0; run={}; pend=list(order)
    while pend or run:
        for n in list(pend):
            if len(run)>=lanes: break
            if s.fits(n): run[n]=t+times[n]+0.05; s.running[n]=rt.claims(n); pend.remove(n)
        n=min(run,key=run.get); t=run.pop(n); del s.running[n]
    return t
for l in (1,2,3,4): print(l, round(sim(l)))

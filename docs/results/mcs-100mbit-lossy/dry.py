#!/usr/bin/env python3
"""Per run (`*.ss.txt.gz` of `scripts/bench mcs-sweep --evidence`), on the data's sending side, the share of
samples (3 s after the first on) in which a connection had less unsent data than one congestion
window (`notsent` < `cwnd` x `mss`): a connection that ran dry. Usage, from the repository's
root: `python3 docs/results/mcs-100mbit-lossy/dry.py RUN.ss.txt.gz...`. iperf3's runs count its
control connection (always dry): 1 of N + 1 connections."""
import sys,gzip,os,io,re
sys.path.insert(0,'scripts/bench.d')
import mcs_ss_summary as m
from mcs_ss_summary import num
for p in sys.argv[1:]:
    tmp='/tmp/_ss.txt'
    open(tmp,'wb').write(gzip.open(p).read())
    d=m.parse(tmp)
    side='tgt' if '-read-' in p else 'ini'
    tot=dry=0
    for (s,port),samples in d.items():
        if s!=side: continue
        t0=samples[0][0] if samples else 0
        for t,f in samples:
            if t-t0<3: continue
            cw=num(f.get('cwnd')) if f.get('cwnd') else None
            if cw is None: continue
            mss=num(f.get('mss') or 1448)
            ns=num(f.get('notsent')) if f.get('notsent') else 0
            tot+=1; dry+= ns < cw*mss
    print(os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p).replace('.ss.txt.gz','')), f'{dry}/{tot}', f'{100*dry/max(tot,1):.0f}%')

#!/usr/bin/env python3
"""cgdiff.py A.txt B.txt N [TOP]: self instructions per command by function, (B - A) / N, from
two `callgrind_annotate --auto=no --inclusive=no --threshold=100` listings of runs of
different lengths (start-up, login and logout cancel)."""
import re,sys
def load(f):
    d={}
    for l in open(f):
        m=re.match(r'\s*([\d,]+)\s+\([\s\d.]+%\)\s+(.*)$',l)
        if m and 'PROGRAM TOTALS' not in l:
            k=m.group(2); k=re.sub(r'\s*\[[^\]]*\]$','',k); k=re.sub(r'\s*\([\d,]+x\)$','',k); k=k.split(':',1)[-1]
            d[k]=d.get(k,0)+int(m.group(1).replace(',',''))
    return d
a=load(sys.argv[1]); b=load(sys.argv[2]); n=float(sys.argv[3])
diff={k:(b.get(k,0)-a.get(k,0))/n for k in set(a)|set(b)}
print('total',sum(diff.values()))
for k,v in sorted(diff.items(),key=lambda x:-abs(x[1]))[:int(sys.argv[4]) if len(sys.argv)>4 else 60]: print(f'{v:9.1f} {k[:160]}')

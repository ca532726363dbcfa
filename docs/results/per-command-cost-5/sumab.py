import re,sys,glob,collections
d=sys.argv[1]; N=float(sys.argv[2])
rows=collections.defaultdict(list)
for f in sorted(glob.glob(d+"/perf-*-*.txt")):
    m=re.match(r".*/perf-(target|client)-(.+)-(\d+)\.txt",f); side,l,rep=m.groups()
    r={}
    for line in open(f):
        mm=re.match(r"\s*([\d,.]+)\s+(msec\s+)?(\S+)",line)
        if mm:
            try: v=float(mm.group(1).replace(",",""))
            except: continue
            k=mm.group(3).replace("syscalls:sys_enter_","").replace("raw_syscalls:sys_enter","syscalls")
            if k=="task-clock": v*=1000
            r[k]=v/N
    rows[(l,side)].append(r)
for (l,side),rs in sorted(rows.items()):
    keys=rs[0].keys()
    print(f"{l:8s} {side:6s} "+" ".join(f"{k}={sorted(x[k] for x in rs)[len(rs)//2]:.3f}" for k in keys if k!="seconds"))

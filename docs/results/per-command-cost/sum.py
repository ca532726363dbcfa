import json,sys,re,glob,os
d=sys.argv[1]
def stat(f):
    r={}
    if not os.path.exists(f): return r
    for line in open(f):
        m=re.match(r"\s*([\d,.]+)\s+(msec\s+)?(\S+)",line)
        if m:
            try: r[m.group(3)]=float(m.group(1).replace(",",""))
            except: pass
    return r
for j in sorted(glob.glob(f"{d}/bench-*.json")):
    name=os.path.basename(j)[6:-5]
    res=json.load(open(j))["result"]
    ops=res.get("ops") or 1
    b=stat(f"{d}/stat-bench-{name}.txt"); t=stat(f"{d}/stat-target-{name}.txt")
    cpu=res["cpu"]["user_s"]+res["cpu"]["sys_s"]
    print(f"{name:22} {res['throughput_mib_s']:8.1f} MiB/s ops {ops:7d} bench cpu {cpu/ops*1e6:6.2f}us/op cs {b.get('context-switches',0)/ops:5.2f} sys {b.get('raw_syscalls:sys_enter',0)/ops:5.2f} | target task-clock {t.get('task-clock',0)*1e3/ops:6.2f}us/op cs {t.get('context-switches',0)/ops:5.2f} sys {t.get('raw_syscalls:sys_enter',0)/ops:5.2f}")

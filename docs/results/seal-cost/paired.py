import json,sys,collections,statistics
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    r=json.loads(l); gb=r['bytes']/1e9
    d[(r['session'],r['rw'],r['rep'])][r['label']]=(r['bench_cpu_s']+r['target_cpu_s'])/gb
for s in ('plain','none','aes-256-gcm'):
    for rw in ('write','read'):
        diffs=[v['A']-v['B'] for k,v in d.items() if k[0]==s and k[1]==rw and 'A' in v and 'B' in v]
        if diffs: print(f"{s:12} {rw:5} A-B per rep: {' '.join(f'{x:+.2f}' for x in diffs)}  median {statistics.median(diffs):+.2f}")

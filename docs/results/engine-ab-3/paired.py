import json,sys,statistics as st
for f in sys.argv[1:]:
    rows=[json.loads(l) for l in open(f)]
    for sess in sorted({r['session'] for r in rows}):
      for rw in ('write','read'):
        a={r['rep']:r for r in rows if r['label']=='A' and r['rw']==rw and r['session']==sess}
        b={r['rep']:r for r in rows if r['label']=='B' and r['rw']==rw and r['session']==sess}
        reps=sorted(set(a)&set(b))
        if not reps: continue
        ratio=[a[i]['mib_s']/b[i]['mib_s'] for i in reps]
        cpu=lambda r:(r['bench_cpu_s']+r['target_cpu_s'])/(r['bytes']/1e9)
        ca=[cpu(a[i]) for i in reps]; cb=[cpu(b[i]) for i in reps]
        ma=st.median([a[i]['mib_s'] for i in reps]); mb=st.median([b[i]['mib_s'] for i in reps])
        print(f"{f.split('/')[-1]:22} {sess:12} {rw:5} A {ma:7.0f} B {mb:7.0f} A/B medians {ma/mb:.3f} paired median {st.median(ratio):.3f} [{min(ratio):.2f}-{max(ratio):.2f}] A faster {sum(r>1 for r in ratio)}/{len(ratio)}  CPU-s/GB A {st.median(ca):.2f} B {st.median(cb):.2f}")

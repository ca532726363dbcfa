import re,subprocess,sys,collections
for f in sys.argv[1:]:
    out=subprocess.run(["perf","report","-i",f,"--no-children","--sort","dso,sym","--stdio","-g","none"],capture_output=True,text=True).stdout
    cats=collections.Counter()
    for l in out.splitlines():
        m=re.match(r"\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)",l)
        if not m: continue
        p=float(m.group(1)); dso=m.group(2); sym=m.group(4).strip()
        if sym in("_copy_to_iter",): c="kernel copy: socket recv (copy_to_iter)"
        elif sym=="_copy_from_iter": c="kernel copy: socket send (copy_from_iter)"
        elif "memmove" in sym or "memcpy" in sym: c="user memcpy (libc memmove)"
        elif "crc32" in sym: c="ceph messenger crc32c"
        elif sym in("clear_page_erms","do_huge_pmd_anonymous_page","exc_page_fault","do_anonymous_page","handle_mm_fault","__handle_mm_fault","folio_zero_user") : c="page faults (clear_page etc.)"
        elif dso.startswith("ipsan"): c="ipsan code"
        elif "ceph" in dso or "rados" in dso or "rbd" in dso: c="librbd/librados other"
        elif dso.startswith("[kernel"): c="kernel other (TCP, scheduler, syscalls)"
        else: c="other user ("+dso+")" if False else "other user libs"
        cats[c]+=p
    print("==",f)
    for c,p in cats.most_common(): print(f"  {p:5.1f}%  {c}")

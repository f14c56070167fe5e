. bench/gpu/prepare.sh >/dev/null 2>&1
python3 -m cProfile -o $OUT/none.prof -m bench.structured --provider cuda --model gpu:16x2048 --streams 64 --tokens 96 --repeats 1 --modes none --out $OUT/n > /dev/null 2>&1
python3 -m cProfile -o $OUT/all.prof -m bench.structured --provider cuda --model gpu:16x2048 --streams 64 --tokens 96 --repeats 1 --modes all --out $OUT/a > /dev/null 2>&1
python3 - <<'PY'
import pstats, os
for m in ("none", "all"):
    print("=====", m)
    st = pstats.Stats(os.environ["OUT"] + f"/{m}.prof")
    st.sort_stats("tottime").print_stats(18)
PY

set -u
cd /tmp; src=$OLDPWD
for u in 134217728 16777216; do for m in twin twin-plain; do timeout 60 python3 $src/scripts/diag_default_graph2.py $m $u 2>&1 | grep -v DEBUG | tail -4; done; done

#!/bin/bash
# Pack a recipe with [lanes] on a Slurm cluster: the plan (the job's only listing of its input,
# here, once), then PARTS array tasks that read it, then the finish.
#   config/slurm/pack.sh RECIPE OUT PARTS [extra sbatch flags…]
# Prints the finish job's id. DSPREP (the binary) is passed on to the jobs. The plan is written
# to OUT.plan.json, which every task must be able to read (a shared filesystem, like OUT).
set -euo pipefail
RECIPE=${1:?usage: pack.sh RECIPE OUT PARTS}
OUT=${2:?usage: pack.sh RECIPE OUT PARTS}
PARTS=${3:?usage: pack.sh RECIPE OUT PARTS}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
PLAN="$OUT.plan.json"
"${DSPREP:-dsprep}" plan --recipe "$RECIPE" --out "$PLAN" >&2
parts=$(sbatch --parsable --array=0-$((PARTS - 1)) "$@" "$here/pack-part.sbatch" "$RECIPE" "$OUT" "$PLAN")
sbatch --parsable --dependency=afterok:"${parts%%;*}" "$@" "$here/pack-finish.sbatch" "$RECIPE" "$OUT" "$PLAN"

#!/bin/bash
# Pack a recipe with [lanes] on a Slurm cluster: PARTS array tasks, then the finish.
#   config/slurm/pack.sh RECIPE OUT PARTS [extra sbatch flags…]
# Prints the finish job's id. DSPREP (the binary) is passed on to the jobs.
set -euo pipefail
RECIPE=${1:?usage: pack.sh RECIPE OUT PARTS}
OUT=${2:?usage: pack.sh RECIPE OUT PARTS}
PARTS=${3:?usage: pack.sh RECIPE OUT PARTS}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
parts=$(sbatch --parsable --array=0-$((PARTS - 1)) "$@" "$here/pack-part.sbatch" "$RECIPE" "$OUT")
sbatch --parsable --dependency=afterok:"${parts%%;*}" "$@" "$here/pack-finish.sbatch" "$RECIPE" "$OUT"

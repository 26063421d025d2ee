#!/bin/bash
# Pack a recipe with [lanes] on a Slurm cluster: the plan (the job's only listing of its input,
# here, once), then PARTS parts packed by Slurm tasks that read it, then the finish.
#   config/slurm/pack.sh RECIPE OUT PARTS [extra sbatch flags…]
# Prints the finish job's id.
#
# Settings (environment, defaults in brackets):
#   DSPREP          the dsprep binary, passed on to the jobs                [dsprep on PATH]
#   PLAN            the job's frozen plan, which every task must be able to read (a shared
#                   filesystem, like OUT); written here unless PLAN names a file that is there
#                                                                           [OUT.plan.json]
#   MAX_ARRAY_SIZE  the site's MaxArraySize: every array index stays below it
#                                       [MaxArraySize of `scontrol show config`, else 1001]
#   TASKS           Slurm tasks that pack the parts, each ceil(PARTS / TASKS) of them in turn
#                                       [PARTS, or MAX_ARRAY_SIZE when PARTS is more]
#   ALLOCATION      "1": the tasks are srun tasks of one job (sbatch --ntasks=TASKS; task =
#                   SLURM_PROCID) instead of an array (task = SLURM_ARRAY_TASK_ID) [unset]
#
# The finish runs once the parts have ended, however they ended (afterany): when some failed or
# were killed, it fails naming them, with the sbatch commands that resubmit only those (as
# `dsprep pack --status` prints them), each array within MAX_ARRAY_SIZE. Those commands carry
# this script's extra sbatch flags (DSPREP_SBATCH_FLAGS) and part script (DSPREP_PART_SCRIPT).
set -euo pipefail
RECIPE=${1:?usage: pack.sh RECIPE OUT PARTS}
OUT=${2:?usage: pack.sh RECIPE OUT PARTS}
PARTS=${3:?usage: pack.sh RECIPE OUT PARTS}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${PLAN:-}" ] && [ -f "$PLAN" ]; then write_plan=""; else write_plan=1; fi
PLAN=${PLAN:-$OUT.plan.json}
max=${MAX_ARRAY_SIZE:-$(scontrol show config 2>/dev/null | awk '$1 == "MaxArraySize" {print $3}' || true)}
max=${max:-1001}
tasks=${TASKS:-$PARTS}
if [ -z "${ALLOCATION:-}" ] && [ "$tasks" -gt "$max" ]; then tasks=$max; fi
per_task=$(( (PARTS + tasks - 1) / tasks ))
tasks=$(( (PARTS + per_task - 1) / per_task ))
flags=""
[ $# -gt 0 ] && flags=$(printf '%q ' "$@")
# The parts' and the finish's settings, exported to the jobs (sbatch passes the environment on).
export PARTS PARTS_PER_TASK=$per_task PART_OFFSET=0
export DSPREP_MAX_ARRAY_SIZE=$max DSPREP_PART_SCRIPT="$here/pack-part.sbatch" DSPREP_SBATCH_FLAGS="$flags"
[ -z "$write_plan" ] || "${DSPREP:-dsprep}" plan --recipe "$RECIPE" --out "$PLAN" >&2
echo "pack.sh: $PARTS parts in $tasks task(s) of $per_task part(s) (MaxArraySize $max)" >&2
if [ -n "${ALLOCATION:-}" ]; then
  parts=$(sbatch --parsable --ntasks="$tasks" "$@" "$here/pack-part.sbatch" "$RECIPE" "$OUT" "$PLAN")
else
  parts=$(sbatch --parsable --array=0-$((tasks - 1)) "$@" "$here/pack-part.sbatch" "$RECIPE" "$OUT" "$PLAN")
fi
sbatch --parsable --dependency=afterany:"${parts%%;*}" "$@" "$here/pack-finish.sbatch" "$RECIPE" "$OUT" "$PLAN"

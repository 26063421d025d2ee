"""One HF Trainer run (run by test_hf_trainer.py): a tiny Llama (hidden 32, 2 layers, built here,
nothing downloaded) trained by `DsprepTrainer` on the daemon at ENDPOINT, checkpointing every 3
optimizer steps into OUTPUT_DIR. Every batch the model is given (a forward pre-hook) is appended
to OUT.jsonl, every logged loss to OUT.loss.jsonl. With "resume" it resumes through the Trainer's
own `resume_from_checkpoint=True`; with "hold:N" it stops still after the N-th batch, to be
killed there.

argv: endpoint, output_dir, out, max_steps, mode ("fresh", "resume" or "hold:N"), recipe.
"""

import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments

from dsprep_client.hf_trainer import DsprepHFDataset, DsprepTrainer


class LogLoss(TrainerCallback):
    def __init__(self, path: str):
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")


def main(endpoint: str, output_dir: str, out: str, max_steps: int, mode: str, recipe: str) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50304, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=512,
    )
    model = LlamaForCausalLM(config)
    hold = int(mode.split(":")[1]) if mode.startswith("hold:") else -1
    seen = []

    def record(module, args, kwargs):
        row = {key: kwargs[key].tolist() for key in ("input_ids", "labels", "position_ids")}
        with open(out + ".jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        seen.append(1)
        if len(seen) == hold:
            time.sleep(1000)  # killed here

    model.register_forward_pre_hook(record, with_kwargs=True)
    args = TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=1, gradient_accumulation_steps=2,
        save_strategy="steps", save_steps=3, logging_steps=1, report_to="none", use_cpu=True, learning_rate=1e-3,
        seed=0, disable_tqdm=True,
    )
    trainer = DsprepTrainer(
        model=model, args=args, train_dataset=DsprepHFDataset(endpoint, rank=0, world_size=1, timeout=20),
        recipe=recipe, callbacks=[LogLoss(out + ".loss.jsonl")],
    )
    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])

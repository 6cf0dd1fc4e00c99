"""Hugging Face ``Trainer`` on a tiny GPT-2 or BERT built from a config (no download), written
for a CUDA machine: ``Trainer`` picks ``cuda`` by itself; ``--fp16`` is ``TrainingArguments(
fp16=True)``, ``--bf16`` its ``bf16=True``; ``--auto-batch`` is ``auto_find_batch_size=True``;
``--cpu`` is ``use_cpu=True``.

Stdout: ``device <trainer device>``, ``loss 1 <step> <float.hex()>`` per optimizer step (from the
loss ``compute_loss`` returned), ``batch <size>`` (the batch size the trainer trained with),
``eval <float.hex()>``; then what the Trainer logged (``logging_steps=1``: its
``state.log_history``) as ``logged <key> <step> <float.hex()>`` for loss, grad_norm,
learning_rate, train_loss and eval_loss, and the trained parameters as ``param`` lines
(fwreport.py).
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import fwreport  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)


class Data(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab, kind, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.kind = kind

    def __len__(self):
        return self.ids.size(0)

    def __getitem__(self, i):
        if self.kind == "gpt2":
            return {"input_ids": self.ids[i], "labels": self.ids[i]}
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.labels[i]}


# what log_history holds besides timings, epochs and flops
LOGGED = ("loss", "grad_norm", "learning_rate", "train_loss", "eval_loss")


class PrintingTrainer(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        out = super().compute_loss(model, inputs, *args, **kwargs)
        loss = out[0] if isinstance(out, tuple) else out
        if model.training:
            self.step_losses.append(loss.detach().float().item())
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["gpt2", "bert"], default="gpt2")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--auto-batch", action="store_true")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    vocab, seq = 128, 16
    if args.model == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=32,
                                           n_layer=2, n_head=2))
    else:
        model = BertForSequenceClassification(BertConfig(
            vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=seq, num_labels=2))
    train = Data(args.steps * args.batch_size, seq, vocab, args.model, seed=1)
    val = Data(8, seq, vocab, args.model, seed=2)

    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=4, max_steps=args.steps, learning_rate=1e-3,
            fp16=args.fp16, bf16=args.bf16, use_cpu=args.cpu,
            auto_find_batch_size=args.auto_batch,
            report_to=[], save_strategy="no", eval_strategy="no",
            # what a user reads: the Trainer's own loss log each step (its accumulator is reset
            # with `tr_loss -= tr_loss` after each log), with the gradient norm it clipped
            logging_strategy="steps", logging_steps=1,
            dataloader_num_workers=0, seed=0, disable_tqdm=True,
        )
        trainer = PrintingTrainer(model=model, args=targs, train_dataset=train, eval_dataset=val)
        trainer.step_losses = []
        print("device", targs.device)
        trainer.train()
        for step, value in enumerate(trainer.step_losses):
            print(f"loss 1 {step} {value.hex()}")
        print("batch", trainer._train_batch_size)
        metrics = trainer.evaluate()
        print(f"eval {float(metrics['eval_loss']).hex()}")
        for entry in trainer.state.log_history:
            for key in LOGGED:
                if key in entry:
                    fwreport.log(key, entry["step"], entry[key])
        fwreport.params(trainer.model)


if __name__ == "__main__":
    main()

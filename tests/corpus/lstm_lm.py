"""Word-level LSTM language model on a synthetic token stream, in the style of
pytorch/examples/word_language_model: batchify, BPTT windows, hidden state repackaged (detached)
between batches, gradient clipping, manual SGD update, learning-rate annealing on plateau.

CUDA idioms exercised: ``torch.device("cuda" if torch.cuda.is_available() else "cpu")``,
``torch.cuda.manual_seed(seed)``, ``data.to(device)`` on the whole corpus once,
``weight.new_zeros(...)`` for the initial hidden state (device follows the parameters),
``torch.cuda.synchronize()`` before reading the epoch time.
"""

import argparse
import sys
import time

import torch
import torch.nn as nn


def synthetic_corpus(n_tokens, vocab, seed):
    """A first-order Markov chain with a sparse random transition table, so there is something
    to learn."""
    table = torch.Generator().manual_seed(1234)
    probs = torch.softmax(torch.randn(vocab, vocab, generator=table) * 3.0, dim=1)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.empty(n_tokens, dtype=torch.long)
    tokens[0] = 0
    choices = torch.multinomial(probs, n_tokens, replacement=True, generator=g)
    for i in range(1, n_tokens):
        tokens[i] = choices[tokens[i - 1], i]
    return tokens


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, inp, hidden):
        emb = self.drop(self.encoder(inp))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return torch.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def main():
    parser = argparse.ArgumentParser(description="LSTM language model on a synthetic stream")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--bptt", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("device", device)

    vocab = 20
    train_data = batchify(synthetic_corpus(6400, vocab, seed=1), args.batch_size, device)
    val_data = batchify(synthetic_corpus(800, vocab, seed=2), 8, device)

    model = RNNModel(vocab, 32, 64, 2).to(device)
    criterion = nn.NLLLoss()
    lr = args.lr
    best_val_loss = None

    for epoch in range(1, args.epochs + 1):
        epoch_start = time.time()
        model.train()
        hidden = model.init_hidden(args.batch_size)
        for step, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i, args.bptt)
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            print(f"loss {epoch} {step} {loss.item().hex()}")

        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(8)
        with torch.no_grad():
            for i in range(0, val_data.size(0) - 1, args.bptt):
                data, targets = get_batch(val_data, i, args.bptt)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        val_loss = total_loss / (len(val_data) - 1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"loss {epoch} val {val_loss.hex()}")
        print(f"| end of epoch {epoch} | time {time.time() - epoch_start:.2f}s | "
              f"lr {lr:.2f} | valid loss {val_loss:.3f}", file=sys.stderr)
        if best_val_loss is None or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0


if __name__ == "__main__":
    main()

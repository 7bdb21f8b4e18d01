"""Iteration over sets and dicts of strings: the order depends on the hash seed."""
words = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
         "kappa", "lambda", "mu"}
print(list(words))
print(list({w: len(w) for w in words} .keys() & words))
print(hash("llft") % 1000)
print(list(frozenset(["x" * i for i in range(1, 12)])))

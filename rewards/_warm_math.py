"""rewards._warm_math — imported as a fork-server preload by the math reward's pool: warms math-verify once.

Importing this module runs `rewards.math.warm_worker()`. It exists only so that a `RewardPool` using the
forkserver start method can warm the fork server itself (the standard library preloads modules, it cannot call
functions): workers forked from it start with math-verify's parser tables and sympy's caches already built.
"""

try:
    from rewards.math import warm_worker

    warm_worker()
except Exception:  # an exception here would kill the fork server; each worker's own warm-up reports problems
    pass

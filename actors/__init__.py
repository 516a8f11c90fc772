"""actors — the distributed system on Ray, and the `fbrl` command line.

Owns: rollout actors, the DeepSpeed learner group, reward workers, placement groups, weight sync,
checkpoint/resume and launching (local `ray.init` or a cluster). May import every other package.
"""

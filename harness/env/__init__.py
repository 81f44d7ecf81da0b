"""The process's surroundings, below everything else: files written whole, the user cache,
where the kernel sources are, environment switches, interruptible C calls, the usable cores."""

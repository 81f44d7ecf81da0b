"""Repository tooling over committed results, not needed to compare: the README's headline,
the experiments' report, the GPU targets' verdicts, and SASS reading for the tests."""

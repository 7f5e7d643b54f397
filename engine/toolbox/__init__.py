"""surecall.toolbox: the four coding tools (shell, file view, file edit, search) and their sandbox."""

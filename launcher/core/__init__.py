"""The ground floor: what every other package shares and nothing of ddpjob's own lies under.

Owns the typed errors and exit codes (``errors``, ``exitcodes``), job states and how several runs'
states combine (``states``), Ctrl-C held over steps that must not be cut (``interrupts``), the memory
quantity parser (``quantity``), JSON values typed (``jsondata``), the field checks shared by the spec and the targets' sections
(``fields``), a run's progress read from its metrics file (``progress``), and the targets found as
plugins through the entry-point group ``ddpjob.targets`` (``plugins``). May import only the
standard library and ``launcher.core`` itself: the local supervisor's quick start loads some of
these modules, and every other package builds on them.
"""

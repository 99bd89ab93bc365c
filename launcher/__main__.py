try:
    from launcher.cli.entry import main
except KeyboardInterrupt:  # Ctrl-C while Python loads the entry point: a quiet exit 130, as anywhere else
    import sys

    sys.stderr.write("\nStopped.\n")
    sys.exit(130)

main()

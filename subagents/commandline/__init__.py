"""Reading a bash command line without running it: which commands it runs
(:mod:`.commands`), looked through their wrappers (:mod:`.wrappers`), word by word
(:mod:`.words`). Used by the ``shell`` rules of tool policies and by the check of
job-defined command templates."""

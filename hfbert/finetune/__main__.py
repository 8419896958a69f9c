from hfbert.finetune.run import command_line

command_line()

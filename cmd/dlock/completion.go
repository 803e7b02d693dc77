package main

import "github.com/spf13/cobra"

func init() { register(newCompletionCommand) }

func newCompletionCommand(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print the shell completion script for bash, zsh, fish or PowerShell",
		Long: `Completion prints a script that completes dlock's commands and flags in your
shell. Install it once:

bash (needs the bash-completion package):
  dlock completion bash > ~/.local/share/bash-completion/completions/dlock
  (system-wide: /etc/bash_completion.d/dlock on Linux,
  $(brew --prefix)/etc/bash_completion.d/dlock on macOS with Homebrew)
  For this shell only: source <(dlock completion bash)

zsh:
  dlock completion zsh > "${fpath[1]}/_dlock"
  (if completion is not on yet, put "autoload -U compinit; compinit" in ~/.zshrc;
  on macOS with Homebrew: dlock completion zsh > $(brew --prefix)/share/zsh/site-functions/_dlock)
  For this shell only: source <(dlock completion zsh)

fish:
  dlock completion fish > ~/.config/fish/completions/dlock.fish
  For this shell only: dlock completion fish | source

PowerShell:
  dlock completion powershell | Out-String | Invoke-Expression
  (add that line to your profile, $PROFILE, to load it in every session)

Start a new shell after installing.`,
		Args:      usageArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(e.stdout, true)
			case "zsh":
				return root.GenZshCompletion(e.stdout)
			case "fish":
				return root.GenFishCompletion(e.stdout, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(e.stdout)
			}
			return usagef("unknown shell %q", args[0]) // not reached: ValidArgs
		},
	}
}

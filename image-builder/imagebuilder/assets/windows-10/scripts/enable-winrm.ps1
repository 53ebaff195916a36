# Run once at first logon (FirstLogonCommands): WinRM over HTTP on the isolated network with NTLM.
# NTLM message encryption protects the traffic, so AllowUnencrypted stays false and Basic stays off.
$ErrorActionPreference = 'Stop'
# A network without a known gateway is "Unidentified" (Public), where WinRM listens for nobody.
Get-NetConnectionProfile | Set-NetConnectionProfile -NetworkCategory Private
Enable-PSRemoting -Force -SkipNetworkProfileCheck
Set-Item WSMan:\localhost\Service\Auth\Basic -Value $false
Set-Item WSMan:\localhost\Service\Auth\Negotiate -Value $true
Set-Item WSMan:\localhost\Service\AllowUnencrypted -Value $false
Set-Item WSMan:\localhost\Shell\MaxMemoryPerShellMB -Value 2048
# Local administrators get a full (not UAC-filtered) token over the network.
New-ItemProperty -Path 'HKLM:\SOFTWARE\Microsoft\Windows\CurrentVersion\Policies\System' `
    -Name LocalAccountTokenFilterPolicy -Value 1 -PropertyType DWord -Force | Out-Null
Get-NetFirewallRule -Name 'gh-winrm-http' -ErrorAction SilentlyContinue | Remove-NetFirewallRule
New-NetFirewallRule -Name 'gh-winrm-http' -DisplayName 'WinRM HTTP (gh-runner)' -Direction Inbound `
    -Protocol TCP -LocalPort 5985 -Action Allow -Profile Any | Out-Null
Set-Service -Name WinRM -StartupType Automatic
Restart-Service -Name WinRM

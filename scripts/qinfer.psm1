# qinfer.psm1: Invoke-Qinfer sends one question to a local model (qinfer run)
# or to a running `qinfer serve`, and returns only the answer text -- the same
# as scripts/qinfer-ask for POSIX shells.
#
#   Import-Module .\scripts\qinfer.psm1
#   Invoke-Qinfer -Model C:\models\Qwen3-8B-Q4_K_M.gguf "What is 6*7?"
#   Get-Content notes.txt | Invoke-Qinfer -Url http://127.0.0.1:8080 "Summarize:"
#
# Defaults come from $env:QINFER (the binary), $env:QINFER_MODEL and $env:QINFER_URL.

function Invoke-Qinfer {
    [CmdletBinding()]
    param(
        # The question. Piped text is appended after a blank line.
        [Parameter(Position = 0)] [string] $Question,
        [Parameter(ValueFromPipeline = $true)] [string[]] $InputObject,
        [string] $Model = $env:QINFER_MODEL,
        [string] $Url = $env:QINFER_URL,
        [string] $System,
        [int] $MaxTokens = 0,
        [Nullable[double]] $Temperature = $null,
        # Keep the model's thinking (default: thinking off, answer only).
        [switch] $Think,
        [string] $Qinfer = $(if ($env:QINFER) { $env:QINFER } else { 'qinfer' })
    )
    begin {
        $piped = New-Object System.Collections.Generic.List[string]
        $utf8 = New-Object System.Text.UTF8Encoding($false)
    }
    process {
        foreach ($line in $InputObject) { $piped.Add($line) }
    }
    end {
        $text = $Question
        if ($piped.Count -gt 0) {
            $pipedText = $piped -join "`n"
            if ($text) { $text = "$text`n`n$pipedText" } else { $text = $pipedText }
        }
        if (-not $text) { throw 'Invoke-Qinfer: no question (give -Question or pipe text in)' }

        if ($Url) {
            $messages = @()
            if ($System) { $messages += @{ role = 'system'; content = $System } }
            $messages += @{ role = 'user'; content = $text }
            $body = @{ model = 'qinfer'; stream = $false; messages = $messages }
            if ($MaxTokens -gt 0) { $body.max_tokens = $MaxTokens }
            if ($null -ne $Temperature) { $body.temperature = $Temperature }
            if (-not $Think) { $body.chat_template_kwargs = @{ enable_thinking = $false } }
            $json = ConvertTo-Json -InputObject $body -Depth 5 -Compress
            # Bytes in and bytes out: Windows PowerShell 5.1 would otherwise send
            # the body in the ANSI code page and decode the answer as Latin-1.
            $response = Invoke-WebRequest -UseBasicParsing -Method Post -Uri ($Url.TrimEnd('/') + '/v1/chat/completions') `
                -ContentType 'application/json; charset=utf-8' -Body $utf8.GetBytes($json)
            $reply = ConvertFrom-Json -InputObject $utf8.GetString($response.RawContentStream.ToArray())
            $answer = [string]$reply.choices[0].message.content
        }
        else {
            if (-not $Model) { throw 'Invoke-Qinfer: give -Model (or $env:QINFER_MODEL) or -Url (or $env:QINFER_URL)' }
            # The question goes through a UTF-8 file: no quoting or code-page
            # conversion on the command line, no length limit.
            $questionFile = [System.IO.Path]::GetTempFileName()
            $logFile = [System.IO.Path]::GetTempFileName()
            $savedEncoding = [Console]::OutputEncoding
            try {
                [System.IO.File]::WriteAllText($questionFile, $text, $utf8)
                $qargs = @('run', '-m', $Model, '--chat', '-f', $questionFile)
                if ($System) { $qargs += @('--system-prompt', $System) }
                if ($MaxTokens -gt 0) { $qargs += @('-n', $MaxTokens) }
                if ($null -ne $Temperature) { $qargs += @('--temp', $Temperature.ToString([cultureinfo]::InvariantCulture)) }
                if (-not $Think) { $qargs += '--no-think' }
                # qinfer writes UTF-8; PowerShell decodes a program's output with this encoding.
                [Console]::OutputEncoding = $utf8
                $lines = & $Qinfer @qargs 2> $logFile
                if ($LASTEXITCODE -ne 0) {
                    throw ('Invoke-Qinfer: ' + ((Get-Content -LiteralPath $logFile) -join ' '))
                }
                $answer = $lines -join "`n"
            }
            finally {
                [Console]::OutputEncoding = $savedEncoding
                Remove-Item -LiteralPath $questionFile, $logFile -ErrorAction SilentlyContinue
            }
        }
        if (-not $Think) {
            $end = $answer.LastIndexOf('</think>')
            if ($end -ge 0) { $answer = $answer.Substring($end + 8) }
        }
        $answer.Trim()
    }
}

Export-ModuleMember -Function Invoke-Qinfer

/**
 * Quoting for the shell commands ipwarden prints for an operator to run (doctor's fixes). Pure.
 */

/** Characters a POSIX shell never treats specially inside a word. */
const SAFE_WORD = /^[A-Za-z0-9_@%+=:,./-]+$/;

/**
 * `word` as one POSIX shell word (sh, bash, zsh): unchanged when it holds only
 * `A-Z a-z 0-9 _ @ % + = : , . / -`, else in single quotes, each `'` written `'\''`; the empty
 * string is `''`. Nothing inside single quotes is special to the shell (POSIX.1-2017 XCU 2.2.2).
 */
export function shellQuote(word: string): string {
  if (SAFE_WORD.test(word)) return word;
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

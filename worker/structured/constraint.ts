import { type ConstraintSpec, constraintKey } from "../../schema/constraint.ts";
import { LazyDfa } from "./dfa.ts";
import { jsonObjectGrammar, jsonSchemaGrammar } from "./json-schema.ts";
import { alt, bytes, compileNfa, GrammarError, type Node } from "./nfa.ts";
import { parseRegex } from "./regex.ts";
import { TokenMachine, TokenTrie } from "./token-machine.ts";

/**
 * Constraint specs compiled against one vocabulary, with a bounded cache:
 * requests with the same spec share one machine (its DFA and masks warm up
 * once). Compiling a spec also validates it: an unsupported schema keyword or
 * a bad regex is a GrammarError naming it.
 */

export const MAX_CHOICES = 1024;
/** Compiled machines kept per vocabulary (least recently used dropped first). */
export const MAX_CACHED_MACHINES = 32;

export function grammarOf(spec: ConstraintSpec): Node {
  switch (spec.kind) {
    case "json_schema":
      return jsonSchemaGrammar(spec.schema);
    case "json_object":
      return jsonObjectGrammar();
    case "regex":
      return parseRegex(spec.pattern);
    case "choice":
      if (spec.choices.length === 0 || spec.choices.length > MAX_CHOICES)
        throw new GrammarError(`a choice needs 1 to ${MAX_CHOICES} strings`);
      return alt(...spec.choices.map((c) => bytes(c)));
  }
}

/** The compiled automaton of a spec, vocabulary-free (what the front door checks requests against). */
export function compileConstraint(spec: ConstraintSpec): LazyDfa {
  return new LazyDfa(compileNfa(grammarOf(spec)));
}

export class ConstraintCompiler {
  private readonly trie: TokenTrie;
  private readonly machines = new Map<string, TokenMachine>();

  constructor(tokenBytes: readonly (Uint8Array | null)[]) {
    this.trie = TokenTrie.build(tokenBytes);
  }

  machine(spec: ConstraintSpec): TokenMachine {
    const key = constraintKey(spec);
    const known = this.machines.get(key);
    if (known) {
      this.machines.delete(key);
      this.machines.set(key, known);
      return known;
    }
    const m = new TokenMachine(compileConstraint(spec), this.trie);
    if (this.machines.size >= MAX_CACHED_MACHINES) this.machines.delete(this.machines.keys().next().value!);
    this.machines.set(key, m);
    return m;
  }
}

"""MuZero's targets and loss as pure functions (Schrittwieser et al., 2020, "Mastering Atari,
Go, chess and shogi by planning with a learned model", and its pseudocode's `make_target`,
`update_weights`, `scale_gradient`).

A position's targets look K moves ahead in its game: at each step k = 0..K the search's
policy and value for the player to move, and the reward of the moves between. In a board
game the paper's value target is the outcome (the pseudocode's `td_steps` reaching the
game's end); with `td_steps` = n it is the outcome where the game ends within n moves, else
the search's root value n moves on, as the move was searched (the pseudocode's
`make_target`). Past the end, the absorbing state's value and reward are 0 and its policy has
no target.
"""

from __future__ import annotations

from collections.abc import Mapping

import chex
import jax
import jax.numpy as jnp
import optax

from trellis.agents.common.self_play import value_targets


def n_step_values(rewards: jax.Array, terminated: jax.Array, player: jax.Array,
                  predicted: jax.Array | None, td_steps: int) -> tuple[jax.Array, jax.Array]:
    """Each position's value target for the player to move there, and whether known: its
    game's outcome where the game ends within the `td_steps` moves t..t+n-1, else the
    predicted value at t + n, negated where the other player moves there (a zero-sum game);
    unknown where neither lies within the moves.

    As `agents.common.self_play.value_targets` (whose outcome it is at n = 0, and whose
    arguments these are): rewards are non-zero only at a game's end, so none lies between.

    Args:
      rewards, terminated, player: [T, B, 2], [T, B], [T, B] as `value_targets`'.
      predicted: [T, B] the value of each position for the player to move there (unread
        where n = 0).
      td_steps: n >= 0; 0: the outcome wherever it is known.

    Returns:
      (values [T, B] in the mover's view, known [T, B]).
    """
    outcome, known = value_targets(rewards, terminated, player)
    if not td_steps:
        return outcome, known
    assert predicted is not None, "n-step value targets bootstrap from predicted values"
    length = terminated.shape[0]
    now = jnp.arange(length)
    # ended[t]: games ended by the moves before t; a game ends within t..t+n-1 iff it grows.
    ended = jnp.concatenate([jnp.zeros_like(terminated[:1], jnp.int32),
                             jnp.cumsum(terminated, axis=0, dtype=jnp.int32)])
    ends_soon = ended[jnp.minimum(now + td_steps, length)] > ended[:length]
    inside = (now + td_steps < length)[:, None]
    later = jnp.minimum(now + td_steps, length - 1)
    bootstrap = jnp.where(player[later] == player, predicted[later], -predicted[later])
    values = jnp.where(ends_soon, outcome, jnp.where(inside, bootstrap, 0.0))
    return values, ends_soon | inside


def unroll_targets(action: jax.Array, policy: jax.Array, rewards: jax.Array,
                   terminated: jax.Array, player: jax.Array, num_unroll_steps: int,
                   td_steps: int = 0, predicted: jax.Array | None = None
                   ) -> dict[str, jax.Array]:
    """The K-step targets of the first T of 2T consecutive moves of games side by side.

    As in `agents.common.self_play.value_targets`, a game that ends at move t is followed at
    t + 1 by a new one, and a position whose value target is not known within the 2T moves
    (`n_step_values`) has no target yet (weight 0); a game no longer than T moves ends within
    them, and with K + n <= T every position's targets are known.

    Args:
      action: [2T, B] the move made at t.
      policy: [2T, B, A] the search's visit distribution at t.
      rewards: [2T, B, 2] each player's reward for the move made at t.
      terminated: [2T, B] the move made at t ended the game.
      player: [2T, B] who moves at t.
      num_unroll_steps: K, K + n <= T.
      td_steps: n, value targets bootstrapped n moves on (`n_step_values`); 0: the outcome.
      predicted: [2T, B] the value of each position for the player to move (with n > 0).

    Returns:
      {"action": [T, B, K] the moves a_t..a_{t+K-1} (past the game's end: the moves of the
      next game, arbitrary as the pseudocode's random ones), "policy": [T, B, K + 1, A],
      "policy_mask": [T, B, K + 1] (1 while the game goes on), "value": [T, B, K + 1] the
      value target for the player to move at t + k (0 past the end), "reward": [T, B, K]
      the reward of move t + k - 1 for its mover (0 past the end), "weight": [T, B] (1 where
      the value target is known)}.
    """
    chex.assert_rank([action, policy, rewards, terminated, player], [2, 3, 3, 2, 2])
    num_moves, steps = action.shape[0] // 2, num_unroll_steps
    chex.assert_scalar_in(steps + td_steps, 1, num_moves)
    values, known = n_step_values(rewards, terminated, player, predicted, td_steps)  # [2T, B]
    mover_reward = jnp.take_along_axis(
        rewards, player[..., None].astype(jnp.int32), axis=-1)[..., 0]  # [2T, B]
    index = jnp.arange(num_moves)[:, None] + jnp.arange(steps + 1)  # [T, K + 1]

    def ahead(x: jax.Array) -> jax.Array:  # [2T, B, ...] -> [T, B, K + 1, ...]
        return jnp.moveaxis(x[index], 1, 2)

    ended = ahead(terminated).astype(jnp.int32)
    # Step k is in the position's game while none of the moves t..t+k-1 ended it.
    in_game = jnp.concatenate([jnp.ones_like(ended[..., :1]),
                               jnp.cumsum(ended[..., :-1], axis=-1) == 0], axis=-1)
    return {"action": ahead(action)[..., :-1],
            "policy": ahead(policy),
            "policy_mask": in_game.astype(jnp.float32),
            "value": jnp.where(in_game, ahead(values), 0.0),
            "reward": jnp.where(in_game[..., :-1], ahead(mover_reward)[..., :-1], 0.0),
            "weight": known[:num_moves].astype(jnp.float32)}


def scale_gradient(x: jax.Array, scale: float) -> jax.Array:
    """`x` unchanged, its gradient times `scale` (the pseudocode's `scale_gradient`)."""
    return x * scale + jax.lax.stop_gradient(x * (1 - scale))


def muzero_loss(logits: jax.Array, value: jax.Array, reward: jax.Array,
                batch: Mapping[str, jax.Array], value_cost: float, reward_cost: float
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The unrolled model's losses summed over the K + 1 steps, averaged over positions with
    `weight`: cross-entropy to the search's policy (where `policy_mask`), plus `value_cost`
    times the squared value error, plus `reward_cost` times the squared reward error (the
    paper's equation 1 with board games' squared errors; its L2 term is left to the
    optimizer's settings).

    Args:
      logits: [N, K + 1, A] the prediction's policy logits at each step.
      value: [N, K + 1] its values.
      reward: [N, K] the dynamics' rewards of steps 1..K.
      batch: `unroll_targets`' policy, policy_mask, value, reward and weight, rows [N].
      value_cost, reward_cost: the weights of the value and reward losses.

    Returns:
      (loss, {policy_loss, value_loss, reward_loss}), each a sum over steps.
    """
    chex.assert_rank([logits, value, reward], [3, 2, 2])
    weight = batch["weight"]
    total = jnp.maximum(weight.sum(), 1.0)

    def mean(per_position: jax.Array) -> jax.Array:
        return (weight * per_position).sum() / total

    cross_entropy = optax.softmax_cross_entropy(logits, batch["policy"])  # [N, K + 1]
    policy_loss = mean((batch["policy_mask"] * cross_entropy).sum(-1))
    value_loss = mean(jnp.square(value - batch["value"]).sum(-1))
    reward_loss = mean(jnp.square(reward - batch["reward"]).sum(-1))
    loss = policy_loss + value_cost * value_loss + reward_cost * reward_loss
    return loss, {"policy_loss": policy_loss, "value_loss": value_loss,
                  "reward_loss": reward_loss}
